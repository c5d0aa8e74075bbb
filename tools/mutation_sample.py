"""A fixed random sample of mutmut's mutant names matching patterns, for modules whose every mutant
would take too long (the CP mechanisms: each runs gloo process groups of 2, 4 and 8 ranks).

    mutmut run $(python tools/mutation_sample.py 80 'longca.cp.mechanisms.*' 'longca.cp.ring.*')

Reads the names from `mutmut results --all true` (run `mutmut run` once, or any run that generated
the mutants, first); the same seed and mutants give the same sample.
"""

from __future__ import annotations

import argparse
import fnmatch
import random
import subprocess


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, help="how many mutants")
    ap.add_argument("patterns", nargs="+", help="fnmatch patterns of mutant names")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    listing = subprocess.run(["mutmut", "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    names = sorted(
        {
            line.split(":")[0].strip()
            for line in listing.splitlines()
            if any(fnmatch.fnmatch(line.split(":")[0].strip(), p) for p in args.patterns)
        }
    )
    print(" ".join(random.Random(args.seed).sample(names, min(args.n, len(names)))))


if __name__ == "__main__":
    main()
