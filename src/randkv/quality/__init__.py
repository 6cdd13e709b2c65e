"""Quality at matched budgets: a checkable long-generation task, a small trained model, and
RandKV beside scored evictors on the same cadence and budget (`randkv quality train/eval`)."""
