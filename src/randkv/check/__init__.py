"""`randkv check`: prove RandKV on this machine in minutes (see `randkv.check.command`).

`report` holds the results and the verdict, `kernels` the checks that need only torch and
Triton (planner, compactors, attention over compacted caches, CUDA graphs, compile cost,
speed), `engine` the vLLM ones. Every module here imports vLLM lazily.
"""
