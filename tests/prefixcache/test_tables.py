"""Column tables: counting, merging across processes, renumbering and the dict round trip."""

import numpy as np

from prefixcache.tables import MULTI_FILE, from_entries, merge, tabulate

# (file index, unit occurrences, positions whose line follows the previous one)
FILES = [
    (0, ["x = 1", "y = f(x)", "f(x)"], [1]),
    (1, ["x = 1", "z = 2", "f(x)", "f(x)"], [1]),
    (3, ["x = 1", "y = f(x)"], [1]),
    (4, ["q"], []),
]


def _tabulate(files):
    units, unit_files, follow_at, follow_files = [], [], [], []
    for index, found, at in files:
        follow_at += [len(units) + i for i in at]
        follow_files += [index] * len(at)
        units += found
        unit_files += [index] * len(found)
    return tabulate(units, np.array(unit_files), np.array(follow_at, dtype=np.int64), np.array(follow_files))


def test_tabulate_counts_occurrences_with_first_file_and_multi_flag():
    units, follows = _tabulate(FILES).entries()
    assert units == {"x = 1": (3, 0 | MULTI_FILE), "y = f(x)": (2, 0 | MULTI_FILE), "f(x)": (3, 0 | MULTI_FILE),
                     "z = 2": (1, 1), "q": (1, 4)}
    assert follows == {("x = 1", "y = f(x)"): (2, 0 | MULTI_FILE), ("x = 1", "z = 2"): (1, 1)}


def test_merge_of_parts_equals_one_table_of_all_files():
    whole = _tabulate(FILES).entries()
    assert merge([_tabulate(FILES[2:]), _tabulate(FILES[:1]), _tabulate(FILES[1:2])]).entries() == whole
    assert merge([_tabulate(FILES[::2]), _tabulate(FILES[1::2])]).entries() == whole


def test_renumber_keeps_the_multi_flag_and_entries_round_trip():
    tables = _tabulate(FILES)
    tables.renumber(np.array([0, 1, 0, 2, 3]))  # file 2 was skipped: 3 and 4 close the gap
    units, follows = tables.entries()
    assert units["q"] == (1, 3) and units["x = 1"] == (3, MULTI_FILE)
    again = from_entries(units, {**follows, ("x = 1", "not a unit"): (1, 0)})
    assert again.entries() == (units, follows)  # the pair whose line is unknown is dropped


def test_empty_tables():
    empty = tabulate([], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert empty.entries() == ({}, {}) and merge([empty, _tabulate(FILES)]).entries() == _tabulate(FILES).entries()
