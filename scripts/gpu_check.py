"""Former GPU check script: now `randkv check` (see README, "On GPUs").

Kept so existing instructions work: `python scripts/gpu_check.py [--out FILE]` runs
`randkv check --no-engine --json FILE` from this source tree (`--smoke` is accepted and
ignored: without CUDA the command runs its CPU parts anyway).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="ignored (see module docstring)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu_check.json")
    args = parser.parse_args()
    from randkv.check.command import main as check

    return check(["--no-engine", "--json", str(args.out)])


if __name__ == "__main__":
    sys.exit(main())
