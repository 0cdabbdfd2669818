# SPDX-License-Identifier: Apache-2.0
"""python -m strata COMMAND: the package's command-line fronts.

    python -m strata generate --model DIR --prompt TEXT [strata generate's options]

(strata.generate: the model's tokenizer.json around the strata binary.)
"""

import sys


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] == "generate":
        from .generate import main as generate
        return generate(argv[1:])
    print("python -m strata: unknown command %r (commands: generate)" % argv[0], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
