"""Functions callgrind saw executing in the given binaries, hottest first.

    callgrind_functions.py BINARY... -- CALLGRIND_OUT...

Reads profiles written with --compress-strings=no --compress-pos=no
--demangle=no; prints one mangled symbol name a line (for lld's
--symbol-ordering-file), by instructions executed in the function itself,
summed over all profiles.
"""

import collections
import os
import sys


def main():
    split = sys.argv.index("--")
    binaries = {os.path.realpath(b) for b in sys.argv[1:split]}
    cost = collections.Counter()
    for path in sys.argv[split + 1:]:
        obj, fn, after_calls = None, None, False
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("ob="):
                    obj = line[3:].strip()
                elif line.startswith("fn="):
                    # "'2" marks a recursion level, not part of the symbol.
                    name = line[3:].strip().split("'")[0]
                    fn = name if obj in binaries and name.startswith("_") else None
                    if fn:
                        cost[fn] += 0
                    after_calls = False
                elif line.startswith("calls="):
                    # The next cost line is the call's inclusive cost.
                    after_calls = True
                elif line[:1].isdigit() or line[:1] in "+-*":
                    if after_calls:
                        after_calls = False
                    elif fn:
                        parts = line.split()
                        if len(parts) > 1:
                            cost[fn] += int(parts[1])
    for name, _ in sorted(cost.items(), key=lambda kv: (-kv[1], kv[0])):
        print(name)


if __name__ == "__main__":
    main()
