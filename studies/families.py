"""Problem families: every task draws its evaluation and training problems from separate
seeded streams, so that no evaluation problem is trained on."""

__all__ = ["EVAL_FAMILY", "TRAIN_FAMILY"]

#: Evaluation problems come from this task family.
EVAL_FAMILY = 0

#: Training problems come from task families TRAIN_FAMILY + seed (the families are
#: independent random streams, so train and eval problems differ).
TRAIN_FAMILY = 1_000_000
