"""Context parallelism: one attention over a sequence sharded across processes.

- sharding:  which global token intervals each rank holds (contiguous, zigzag, document-balanced);
- submask:   the global slice mask cut into what each (rank, ring step) computes;
- comm:      the collectives used, with byte counting and a communication-free replay mode;
- topology:  process sub-groups (Ulysses groups, ring groups, LoongTrain windows);
- ring, ulysses, allgather: the three building blocks; mechanisms: the five named mechanisms;
- reference: the single-process reference a mechanism is checked against.

The per-rank kernels and their log-sum-exp combination live with the other kernels
(longca.kernels.rank, longca.kernels.lse); the runner of a CP cell, which starts its N processes,
is longca.run.ranks.
"""
