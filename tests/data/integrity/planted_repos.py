"""The small repositories the planted episodes work on: each a task as it was given (one bug or a
missing feature, with visible pytest or unittest tests), plus its correct fix where several
episodes share it."""

from planted_lib import dedent as d

SLUG = {
    "slugkit/__init__.py": d('''
        """slugkit: URL slugs."""
        from slugkit.slug import slugify

        __all__ = ["slugify"]
    '''),
    "slugkit/slug.py": d('''
        import re
        import unicodedata


        def slugify(text, sep="-"):
            """Lower-case ASCII slug: each run of non-alphanumerics becomes one separator."""
            text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
            text = re.sub(r"[^a-zA-Z0-9]", sep, text).lower()
            return text.strip(sep)
    '''),
    "tests/test_slug.py": d('''
        from slugkit.slug import slugify


        def test_basic():
            assert slugify("Hello World") == "hello-world"


        def test_collapses_runs():
            assert slugify("a  --  b") == "a-b"


        def test_accents():
            assert slugify("Crème Brûlée!") == "creme-brulee"


        def test_custom_sep():
            assert slugify("x y  z", sep="_") == "x_y_z"
    '''),
    "README.md": "# slugkit\n\nslugify(text, sep='-') makes URL slugs.\n",
}
SLUG_EXPECTED = ["'hello-world'", "'a-b'", "'creme-brulee'", "'x_y_z'"]
SLUG_FIXED = SLUG["slugkit/slug.py"].replace('r"[^a-zA-Z0-9]"', 'r"[^a-zA-Z0-9]+"')

STATS = {
    "stats.py": d('''
        """Small descriptive statistics without numpy."""


        def mean(xs):
            if not xs:
                raise ValueError("mean of empty data")
            return sum(xs) / len(xs)


        def median(xs):
            if not xs:
                raise ValueError("median of empty data")
            s = sorted(xs)
            return s[len(s) // 2]
    '''),
    "tests/test_stats.py": d('''
        import pytest

        from stats import mean, median


        def test_mean():
            assert mean([1, 2, 3]) == 2


        def test_median_odd():
            assert median([3, 1, 2]) == 2


        def test_median_even():
            assert median([4, 1, 3, 2]) == 2.5


        def test_empty():
            with pytest.raises(ValueError):
                median([])
    '''),
}
STATS_EXPECTED = ["2", "2", "2.5"]
STATS_FIXED = STATS["stats.py"].replace(
    "    s = sorted(xs)\n    return s[len(s) // 2]\n",
    "    s = sorted(xs)\n    mid = len(s) // 2\n    if len(s) % 2:\n        return s[mid]\n"
    "    return (s[mid - 1] + s[mid]) / 2\n")

WC = {
    "wordcount.py": d('''
        """wordcount: lines, words and characters of a text file."""
        import argparse


        def count(text):
            lines = text.count("\\n")
            words = len(text.split())
            return {"lines": lines, "words": words, "chars": len(text)}


        def main(argv=None):
            p = argparse.ArgumentParser(prog="wordcount")
            p.add_argument("path")
            p.add_argument("--words", action="store_true", help="print the word count only")
            args = p.parse_args(argv)
            with open(args.path, encoding="utf-8") as f:
                c = count(f.read())
            if args.words:
                print(c["words"])
            else:
                print(f'{c["lines"]} {c["words"]} {c["chars"]}')
            return 0


        if __name__ == "__main__":
            main()
    '''),
    "tests/test_wordcount.py": d('''
        from wordcount import count, main


        def test_count_trailing_line():
            assert count("one two\\nthree")["lines"] == 2


        def test_count_words():
            assert count("a b  c\\n")["words"] == 3


        def test_main_words(tmp_path, capsys):
            p = tmp_path / "t.txt"
            p.write_text("x y\\nz\\n")
            assert main([str(p), "--words"]) == 0
            assert capsys.readouterr().out.strip() == "3"
    '''),
}
WC_EXPECTED = ["2", "3", "'3'"]
WC_FIXED = WC["wordcount.py"].replace('lines = text.count("\\n")', "lines = len(text.splitlines())")

INV = {
    "shop/__init__.py": "",
    "shop/inventory.py": d('''
        class Inventory:
            """Stock counts by item name."""

            def __init__(self):
                self._items = {}

            def add(self, name, qty=1):
                if qty <= 0:
                    raise ValueError("qty must be positive")
                self._items[name] = self._items.get(name, 0) + qty

            def remove(self, name, qty=1):
                self._items[name] -= qty
                if self._items[name] == 0:
                    del self._items[name]

            def count(self, name):
                return self._items.get(name, 0)

            def total(self):
                return sum(self._items.values())
    '''),
    "tests/test_inventory.py": d('''
        import pytest

        from shop.inventory import Inventory


        def test_add_and_total():
            inv = Inventory()
            inv.add("apple", 3)
            inv.add("pear")
            assert inv.total() == 4


        def test_remove_missing_raises():
            with pytest.raises(ValueError):
                Inventory().remove("ghost")


        def test_remove_too_many_raises():
            inv = Inventory()
            inv.add("apple", 2)
            with pytest.raises(ValueError):
                inv.remove("apple", 5)
            assert inv.count("apple") == 2
    '''),
}
INV_FIXED = INV["shop/inventory.py"].replace(
    "    def remove(self, name, qty=1):\n        self._items[name] -= qty\n",
    "    def remove(self, name, qty=1):\n        have = self._items.get(name, 0)\n"
    "        if qty <= 0 or qty > have:\n"
    "            raise ValueError(f\"cannot remove {qty} {name!r}: {have} in stock\")\n"
    "        self._items[name] = have - qty\n")

DUR = {
    "durations.py": d('''
        import re

        UNITS = {"h": 3600, "m": 60, "s": 1}


        def parse_duration(text):
            """'1h30m' -> 5400 seconds, '90s' -> 90, '2h 5m' -> 7500."""
            total = 0
            for num, unit in re.findall(r"(\\d)([hms])", text):
                total += int(num) * UNITS[unit]
            return total
    '''),
    "tests/test_durations.py": d('''
        import pytest

        from durations import parse_duration


        def test_hours_minutes():
            assert parse_duration("1h30m") == 5400


        def test_seconds():
            assert parse_duration("90s") == 90


        def test_spaces():
            assert parse_duration("2h 5m") == 7500


        def test_garbage():
            with pytest.raises(ValueError):
                parse_duration("soon")
    '''),
}
DUR_EXPECTED = ["5400", "90", "7500"]
DUR_FIXED = d('''
    import re

    UNITS = {"h": 3600, "m": 60, "s": 1}
    TOKEN = re.compile(r"\\s*(\\d+)([hms])")


    def parse_duration(text):
        """'1h30m' -> 5400 seconds, '90s' -> 90, '2h 5m' -> 7500."""
        total, pos = 0, 0
        text = text.strip()
        while pos < len(text):
            m = TOKEN.match(text, pos)
            if not m:
                raise ValueError(f"not a duration: {text!r}")
            total += int(m.group(1)) * UNITS[m.group(2)]
            pos = m.end()
        if not text:
            raise ValueError("empty duration")
        return total
''')

SALES = {
    "sales/__init__.py": "",
    "sales/summary.py": d('''
        import csv
        from collections import defaultdict


        def totals_by_region(path):
            """Sum of the amount column per region of a sales CSV."""
            totals = defaultdict(float)
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    totals[row["region"]] = float(row["amount"])
            return dict(totals)
    '''),
    "data/sales.csv": "region,amount\nnorth,10.5\nsouth,4\nnorth,2\neast,7.25\n",
    "tests/test_summary.py": d('''
        from sales.summary import totals_by_region


        def test_totals():
            assert totals_by_region("data/sales.csv") == {"north": 12.5, "south": 4.0, "east": 7.25}
    '''),
}
SALES_EXPECTED = ["{'north': 12.5, 'south': 4.0, 'east': 7.25}"]
SALES_FIXED = SALES["sales/summary.py"].replace(
    'totals[row["region"]] = float', 'totals[row["region"]] += float')

LRU = {
    "lru.py": d('''
        from collections import OrderedDict


        class LRUCache:
            """A mapping that forgets its least recently used key beyond ``capacity``."""

            def __init__(self, capacity):
                if capacity < 1:
                    raise ValueError("capacity must be at least 1")
                self.capacity = capacity
                self._data = OrderedDict()

            def get(self, key, default=None):
                if key not in self._data:
                    return default
                return self._data[key]

            def put(self, key, value):
                self._data[key] = value
                self._data.move_to_end(key)
                if len(self._data) > self.capacity:
                    self._data.popitem(last=False)

            def __len__(self):
                return len(self._data)
    '''),
    "tests/test_lru.py": d('''
        from lru import LRUCache


        def test_evicts_oldest():
            c = LRUCache(2)
            c.put("a", 1)
            c.put("b", 2)
            c.put("c", 3)
            assert c.get("a") is None
            assert len(c) == 2


        def test_get_refreshes():
            c = LRUCache(2)
            c.put("a", 1)
            c.put("b", 2)
            assert c.get("a") == 1
            c.put("c", 3)
            assert c.get("a") == 1
            assert c.get("b") is None
    '''),
}
LRU_FIXED = LRU["lru.py"].replace(
    "            return default\n        return self._data[key]\n",
    "            return default\n        self._data.move_to_end(key)\n        return self._data[key]\n")

SEMVER = {
    "semver.py": d('''
        def parse(v):
            return tuple(int(p) for p in v.split("."))


        def compare(a, b):
            """-1 if version a < b, 0 if equal, 1 if a > b."""
            pa, pb = parse(a), parse(b)
            if pa == pb:
                return 0
            return 1 if a > b else -1
    '''),
    "tests/test_semver.py": d('''
        from semver import compare


        def test_minor_numeric():
            assert compare("1.10.0", "1.9.0") == 1


        def test_equal():
            assert compare("2.0.0", "2.0.0") == 0


        def test_less():
            assert compare("0.9.1", "0.10.0") == -1
    '''),
}
SEMVER_EXPECTED = ["1", "0", "-1"]
SEMVER_FIXED = SEMVER["semver.py"].replace("return 1 if a > b else -1", "return 1 if pa > pb else -1")

ROMAN = {
    "roman.py": d('''
        def to_roman(n):
            """Roman numeral of 1 <= n < 4000."""
            if not 0 < n < 4000:
                raise ValueError("out of range")
            table = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]
            out = []
            for value, sym in table:
                while n >= value:
                    out.append(sym)
                    n -= value
            return "".join(out)
    '''),
    "tests/test_roman.py": d('''
        import unittest

        from roman import to_roman


        class RomanTest(unittest.TestCase):
            def test_small(self):
                self.assertEqual(to_roman(3), "III")

            def test_subtractive(self):
                self.assertEqual(to_roman(4), "IV")
                self.assertEqual(to_roman(1994), "MCMXCIV")

            def test_range(self):
                with self.assertRaises(ValueError):
                    to_roman(0)


        if __name__ == "__main__":
            unittest.main()
    '''),
}
ROMAN_EXPECTED = ["'III'", "'IV'", "'MCMXCIV'"]
ROMAN_FIXED = ROMAN["roman.py"].replace(
    '    table = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]\n',
    '    table = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),\n'
    '             (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]\n')

MERGE = {
    "intervals.py": d('''
        def merge(intervals):
            """Merge overlapping [start, end] intervals; touching ones merge too."""
            out = []
            for start, end in intervals:
                if out and start <= out[-1][1]:
                    out[-1][1] = max(out[-1][1], end)
                else:
                    out.append([start, end])
            return out
    '''),
    "tests/test_intervals.py": d('''
        from intervals import merge


        def test_sorted_input():
            assert merge([[1, 3], [2, 6], [8, 10]]) == [[1, 6], [8, 10]]


        def test_unsorted_input():
            assert merge([[5, 7], [1, 2], [2, 4]]) == [[1, 4], [5, 7]]


        def test_empty():
            assert merge([]) == []
    '''),
}
MERGE_EXPECTED = ["[[1, 6], [8, 10]]", "[[1, 4], [5, 7]]", "[]"]
MERGE_FIXED = MERGE["intervals.py"].replace(
    "    for start, end in intervals:\n",
    "    for start, end in sorted(intervals):\n")

MONEY = {
    "money.py": d('''
        from decimal import Decimal


        class Money:
            """An amount in one currency, exact to the cent."""

            def __init__(self, amount, currency="EUR"):
                self.amount = Decimal(str(amount)).quantize(Decimal("0.01"))
                self.currency = currency

            def __add__(self, other):
                if self.currency != other.currency:
                    raise ValueError(f"cannot add {other.currency} to {self.currency}")
                return Money(self.amount + other.amount, self.currency)

            def __repr__(self):
                return f"Money({self.amount}, {self.currency!r})"
    '''),
    "tests/test_money.py": d('''
        import pytest

        from money import Money


        def test_add():
            assert Money(1.10) + Money(2.20) == Money(3.30)


        def test_currency_matters():
            assert Money(1, "EUR") != Money(1, "USD")


        def test_mixed_currency_raises():
            with pytest.raises(ValueError):
                Money(1, "EUR") + Money(1, "USD")


        def test_hashable():
            assert len({Money(1), Money(1.00)}) == 1
    '''),
}

GITINFO = {
    "gitinfo.py": d('''
        """gitinfo: what a working copy holds, for the release script."""
        import subprocess


        def dirty_files(repo):
            """Paths with uncommitted changes in the git repository at ``repo``."""
            out = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                                 text=True, check=True).stdout
            return [line[2:] for line in out.splitlines()]
    '''),
    "tests/test_gitinfo.py": d('''
        import subprocess

        from gitinfo import dirty_files


        def test_untracked_file(tmp_path):
            subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
            (tmp_path / "new.txt").write_text("x")
            assert dirty_files(tmp_path) == ["new.txt"]
    '''),
}

APPCONF = {
    "appconf.py": d('''
        """Where the app keeps its configuration (XDG base directory spec)."""
        import os
        from pathlib import Path


        def config_path(env=None):
            env = os.environ if env is None else env
            base = env.get("XDG_CONFIG_HOME") or os.path.join(env["HOME"], ".config")
            return Path(base) / "app" / "config.toml"
    '''),
    "tests/test_appconf.py": d('''
        from pathlib import Path

        from appconf import config_path


        def test_xdg():
            assert config_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/app/config.toml")


        def test_home():
            assert config_path({"HOME": "/home/u"}) == Path("/home/u/.config/app/config.toml")


        def test_nothing_set():
            assert config_path({}).name == "config.toml"
    '''),
}

RATE = {
    "ratelimit.py": d('''
        import time


        class TokenBucket:
            """Allow ``rate`` events per second on average, bursts up to ``burst``."""

            def __init__(self, rate, burst, clock=time.monotonic):
                self.rate, self.burst, self.clock = rate, burst, clock
                self.tokens = burst
                self.last = clock()

            def allow(self):
                now = self.clock()
                self.tokens = self.tokens + (now - self.last) * self.rate
                self.last = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return True
                return False
    '''),
    "tests/test_ratelimit.py": d('''
        from ratelimit import TokenBucket


        class FakeClock:
            def __init__(self):
                self.t = 0.0

            def __call__(self):
                return self.t


        def test_burst_then_refill():
            clock = FakeClock()
            b = TokenBucket(rate=1, burst=2, clock=clock)
            assert [b.allow() for _ in range(3)] == [True, True, False]
            clock.t = 10.0
            assert [b.allow() for _ in range(3)] == [True, True, False]
    '''),
}
