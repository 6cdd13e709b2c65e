"""The ledger task: recall of facts the model itself wrote (`--task ledger`).

- `task`: the problem generator; `checker`: the independent checker;
- `train`: the model's training batches (the loop is `studies.training`);
- `arms`: `COMPARED` (the policies it compares), `SCORED`, what the oracle is told;
- `run`: one arm over the problems (forced decoding, the checker, the survival audit);
- `stats`: strata, clustered CIs, paired tests; `hypotheses`: verdicts on H1-H4;
- `evaluate`: the evaluation driver, ledger.json; `report`: ledger.md and ledger.png.
"""
