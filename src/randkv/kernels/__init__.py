"""The kernels: the spec's decisions and moves on torch tensors, on any device.

The second layer, above `randkv.spec` and below the engine integration and adapters. It
imports torch (and Triton where a kernel needs it) and `randkv.spec`, nothing else of
`randkv` (a test reads the imports).

- `planner`: one round for many requests and every (layer, KV head) at once, bit-identical
  to the spec; `triton_planner` is the same as one Triton kernel.
- `compactor`: applies round plans to paged KV caches (hole-filling moves);
  `triton_compactor` does a step's moves in one Triton launch.
- `slotmap`: slot -> absolute position maps, for observability and tests.
- `triton_jit`: one Triton kernel, compiled on CUDA and interpreted on CPU tensors.
- `hostsync`, `launches`: count the host syncs and the device launches of a piece of code.
- `reference`: poisoned paged caches and the reference compaction the compactors are checked
  against (`randkv check` and the kernel tests).
"""
