#!/usr/bin/env python3
"""The settings table of docs/configuration.md, generated from
config/settings.def through the binary that compiles it (`ferry config
--docs`), between the markers <!-- settings:begin --> and <!-- settings:end -->.

    scripts/settings_table.py           rewrite docs/configuration.md (make docs)
    scripts/settings_table.py --check   exit 1 when the table is stale (the tests)

FERRY_BIN names the binary (default build/ferry)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- settings:begin -->\n", "<!-- settings:end -->\n"


def main():
    check = sys.argv[1:] == ["--check"]
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit(__doc__)
    ferry = os.environ.get("FERRY_BIN", str(ROOT / "build" / "ferry"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    table = subprocess.run([ferry, "config", "--docs"], check=True, stdout=subprocess.PIPE, env=env).stdout.decode()
    readme = ROOT / "docs" / "configuration.md"
    text = readme.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        sys.exit("docs/configuration.md: needs one %s before one %s" % (BEGIN.strip(), END.strip()))
    head, rest = text.split(BEGIN)
    old, tail = rest.split(END)
    if old == table:
        return
    if check:
        sys.exit("docs/configuration.md's settings table is stale: run `make docs` (config/settings.def changed)")
    readme.write_text(head + BEGIN + table + END + tail)
    print("docs/configuration.md: settings table rewritten")


if __name__ == "__main__":
    main()
