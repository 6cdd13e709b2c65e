"""The pointer-chain task (and its tally-chain variant): `python -m studies train|eval`.

- `task`: the problem generator; `checker`: the independent checker;
- `train`: the model's training batches (the loop is `studies.training`);
- `evaluate`: the evaluation driver, `COMPARED` (the policies it compares), quality.json;
- `strata`: Holm over the paired table, accuracy by cycle length;
- `report`: quality.md and quality.png.
"""
