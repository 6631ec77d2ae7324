#!/usr/bin/env python3
"""code_shape.py - two views of the code's shape, for reviews and notes.

  code_shape.py includes HEADER   the project headers HEADER pulls in, as a tree
  code_shape.py longest [N]       the N longest C functions (lines, file:line)

Function extents are found by brace matching on C files with comments and
strings blanked out: good enough for this code base (no K&R definitions,
no braces in macros that open a function).
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC_DIRS = ("engine", "text", "server", "cli", "config")


def project_includes(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m:
                out.append(os.path.normpath(os.path.join(os.path.dirname(path), m.group(1))))
    return out


def include_tree(path, depth=0, seen=None):
    seen = set() if seen is None else seen
    rel = os.path.relpath(path, ROOT)
    mark = " (again)" if path in seen else ""
    print("  " * depth + rel + mark)
    if path in seen:
        return seen
    seen.add(path)
    for inc in project_includes(path):
        include_tree(inc, depth + 1, seen)
    return seen


def blank(text):
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"'(\\.|[^'\\\n])*'", "''", text)
    return text


def functions(path):
    text = blank(open(path, encoding="utf-8").read())
    lines = text.split("\n")
    depth, start, name = 0, None, None
    for i, line in enumerate(lines):
        for ch in line:
            if ch == "{":
                if depth == 0:
                    head = " ".join(lines[max(0, i - 3) : i + 1])
                    m = re.search(r"(\w+)\s*\([^;{}]*\)\s*(__attribute__\(\(.*\)\))?\s*\{?\s*$", head.split("{")[0] + "{")
                    name = m.group(1) if m and "=" not in head.split("(")[0] else None
                    start = i
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and name and name not in ("if", "for", "while", "switch"):
                    yield name, start + 1, i - start + 1
                    name = None


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "includes":
        seen = include_tree(os.path.abspath(sys.argv[2]))
        print(f"{len(seen)} headers")
    elif len(sys.argv) >= 2 and sys.argv[1] == "longest":
        n = int(sys.argv[2]) if len(sys.argv) > 2 else 10
        rows = []
        for d in SRC_DIRS:
            for dp, _, files in os.walk(os.path.join(ROOT, d)):
                for f in files:
                    if f.endswith(".c"):
                        p = os.path.join(dp, f)
                        for name, line, length in functions(p):
                            rows.append((length, name, os.path.relpath(p, ROOT), line))
        rows.sort(reverse=True)
        for length, name, p, line in rows[:n]:
            print(f"{length:5d}  {name:32s} {p}:{line}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
