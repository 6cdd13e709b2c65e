"""The vLLM releases RandKV supports and what it relies on in each: the release table
(`versions`), the version check (`support`), where releases differ (`compat`), the vLLM
internals RandKV touches (`touchpoints`), the drift check that reads them against any
release (`drift`), and a release's wheel fetched for that check (`wheels`)."""
