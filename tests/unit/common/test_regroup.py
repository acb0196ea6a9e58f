"""scripts/regroup.py, the codemod that groups services/common and the router shell: its rewrites are exact
and idempotent, so that it can be run again after merging a branch written against the old layout.

The examples are built from the script's own plan, never spelled out: the codemod rewrites this file too."""

import pytest

from scripts.regroup import check_plan, dotted, name_rewriter, plan, split_from_imports, wrap_long_prose

MOVES = plan()
REWRITE = name_rewriter(MOVES)


def test_the_plan_has_no_new_name_that_starts_with_an_old_one():
    check_plan(MOVES)
    assert len(set(MOVES.values())) == len(MOVES)


@pytest.mark.parametrize("old, new", sorted(MOVES.items()))
def test_each_old_name_and_path_becomes_its_new_one_once(old, new):
    template = "see {p}:12, patch `{d}.Thing`, run python -m {d}; import {d}; match r'-m {e}$'"
    once = REWRITE(template.format(p=old, d=dotted(old), e=dotted(old).replace(".", "\\.")))
    assert once == template.format(p=new, d=dotted(new), e=dotted(new).replace(".", "\\."))
    assert REWRITE(once) == once


def test_a_longer_name_that_contains_an_old_one_is_left_alone():
    old = dotted(next(iter(MOVES)))
    for text in (old + "_extra", "x." + old, "other/" + next(iter(MOVES)), old + "2"):
        assert REWRITE(text) == text


def test_a_from_import_of_moved_modules_is_split_by_their_new_packages():
    router = {dotted(o).rsplit(".", 1)[1]: dotted(n).rsplit(".", 1)[0] for o, n in MOVES.items() if "/router/" in o}
    a = min(router)
    b = min(name for name, package in router.items() if package != router[a])
    parent = "services." + "router"
    text = f"import os\n\n\ndef f():\n    from {parent} import {a}, config as c, {b} as bee  # why\n    return c\n"
    out = split_from_imports(text, MOVES)
    assert out.splitlines()[4:7] == [
        f"    from {router[a]} import {a}  # why",
        f"    from {parent} import config as c",
        f"    from {router[b]} import {b} as bee",
    ]
    assert out.startswith("import os\n\n\ndef f():\n") and out.endswith("    return c\n")
    assert split_from_imports(out, MOVES) == out


def test_a_comment_or_docstring_line_pushed_too_long_is_wrapped_and_code_is_not():
    new = dotted(next(iter(MOVES.values())))
    words = " ".join(["word"] * 30)
    text = f'def f():\n    """{new} {words}"""\n    # {new} {words}\n    x = "{new} {words}"\n'
    out = wrap_long_prose(text, (new,)).splitlines()
    assert all(len(line) <= 120 for line in out[:-1]) and out[-1] == f'    x = "{new} {words}"'
    assert out[2].startswith("    ") and not out[2].startswith("    #")
    assert any(line.startswith("    # word") for line in out)
    assert " ".join(" ".join(out).split()).count("word") == 90


def test_a_one_name_from_import_in_a_string_is_rewritten_once():
    old, new = next((o, n) for o, n in MOVES.items() if "/common/" in o)
    package, name = dotted(old).rsplit(".", 1)
    text = f'code = "import sys; from {package} import {name}; print(1)"'
    once = REWRITE(text)
    assert once == f'code = "import sys; from {dotted(new).rsplit(".", 1)[0]} import {name}; print(1)"'
    assert REWRITE(once) == once
    kept = f"from {package} import {name}_other"
    assert REWRITE(kept) == kept
