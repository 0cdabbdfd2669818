#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every source file carries the line `SPDX-License-Identifier: Apache-2.0`
(LICENSE) in its first two lines (the second when the first is a #! line).

  scripts/check_spdx.py [ROOT]         list the files without it; exit 1 if any
  scripts/check_spdx.py --fix [ROOT]   add it where it is missing

Sources are the tracked files (git ls-files; a tree without .git is walked,
build folders left out) of the kinds below. Data, docs, JSON and the license
itself carry none.
"""
import os
import subprocess
import sys

TAG = "SPDX-License-Identifier: Apache-2.0"
SLASHES = {".cc", ".h", ".cu", ".cuh", ".inc", ".c"}
HASHES = {".py", ".sh", ".cmake", ".in", ".toml"}
HASH_NAMES = {"CMakeLists.txt", "Makefile", "run"}  # run: .ci/run
BLOCK = {".map"}  # linker version scripts take /* */ comments only


def comment(path):
    name = os.path.basename(path)
    ext = os.path.splitext(name)[1]
    if ext in SLASHES:
        return "// " + TAG
    if ext in HASHES or name in HASH_NAMES:
        return "# " + TAG
    if ext in BLOCK:
        return "/* " + TAG + " */"
    return None


def sources(root):
    if os.path.isdir(os.path.join(root, ".git")):
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, capture_output=True).stdout
        return [f.decode() for f in out.split(b"\0") if f]
    found = []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        dirs[:] = [x for x in dirs if not (rel == "." and (x.startswith("build") or x.startswith(".")) and x != ".ci")]
        found += [os.path.normpath(os.path.join(rel, f)) for f in files]
    return found


def main(argv):
    fix = "--fix" in argv
    args = [a for a in argv if a != "--fix"]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
    missing = []
    for rel in sorted(sources(root)):
        line = comment(rel)
        path = os.path.join(root, rel)
        if line is None or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        head = text.split("\n", 2)[:2]
        if any(TAG in h for h in head):
            continue
        if not fix:
            missing.append(rel)
            continue
        if text.startswith("#!"):
            first, _, rest = text.partition("\n")
            text = first + "\n" + line + "\n" + rest
        else:
            text = line + "\n" + text
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print("added to " + rel)
    if missing:
        print("check_spdx: %d source file(s) without '%s' in their first two lines:" % (len(missing), TAG))
        for m in missing:
            print("  " + m)
        print("(scripts/check_spdx.py --fix adds it)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
