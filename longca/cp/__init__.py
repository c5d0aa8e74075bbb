"""Context parallelism: one attention over a sequence sharded across processes.

- sharding:  which global token intervals each rank holds (contiguous, zigzag, document-balanced);
- submask:   the global slice mask cut into what each (rank, ring step) computes;
- lse:       combining partial outputs by log-sum-exp;
- local:     the per-rank attention kernel (naive, flex, sdpa) with a global-LSE backward;
- comm:      the collectives used, with byte counting and a communication-free replay mode;
- topology:  process sub-groups (Ulysses groups, ring groups, LoongTrain windows);
- ring, ulysses, allgather: the three building blocks; mechanisms: the five named mechanisms;
- bench:     the torchrun-launchable entry point (python -m longca.cp.bench).
"""
