"""Quality at matched budgets: checkable long-generation tasks, small trained models, and
RandKV beside the registered policies on the same cadence and budget
(`python -m studies train|eval`).

One folder per task (`pointer/`, `ledger/`) on a shared harness, here:

- `arms`: dense and the registered policies as evaluation arms;
- `schedule`: which runs an evaluation makes, and making them;
- `stats`: CIs, paired tests, Holm; `report`, `plot`: markdown tables and the accuracy plot;
- `model`: the small Qwen3 model, the byte-level tokenizer, the shipped checkpoints;
- `training`: the training loop; `families`: evaluation and training problem families;
- `provenance`: the model and machine records of a result; `cli`: `python -m studies`.
"""
