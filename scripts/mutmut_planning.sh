#!/usr/bin/env bash
# Mutation testing of the split planner's layout and placement (src/grpo_launch/planning/batch_layout.py,
# layout_fixes.py, placement.py, splits/allowed.py and splits/refusals.py; before issue 35: layout.py and
# placement.py) with their fast tests, by mutmut 3 (https://github.com/boxed/mutmut, PyPI "mutmut"). Not part of
# CI and not a project dependency: mutmut goes into a throwaway venv that also sees .venv's packages, and it runs
# in a copy of the tree (it writes mutants/ next to the code it mutates).
#
#   scripts/mutmut_planning.sh [WORKDIR [NAME…]]   default WORKDIR: /tmp/grpo-launch-mutmut
#   MUTMUT_CHILDREN=N  parallel mutants (default 1)
#
# With NAMEs (mutant names as `mutmut results` prints them, fnmatch patterns allowed, e.g.
# 'grpo_launch.planning.batch_layout.x_solve_layout__mutmut_49') only those mutants run, and it ends with each one's
# status (killed / survived); without, every mutant runs (about 1700; long on two shared cores) and it ends with
# `mutmut results` (the survivors). `cd WORKDIR/tree && WORKDIR/venv/bin/mutmut show NAME` prints one as a diff. A
# second run reuses the venv. docs/mutation-testing.md lists the survivors of the last full run and what was done
# about each (docs/mutmut-survivors.tsv, one line each).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-/tmp/grpo-launch-mutmut}
shift || true
MUTMUT_VERSION=3.8.1
mkdir -p "$WORK"

if [ ! -x "$WORK/venv/bin/mutmut" ]; then
  "$ROOT/.venv/bin/python" -m venv "$WORK/venv"
  "$WORK/venv/bin/pip" install -q "mutmut==$MUTMUT_VERSION"
  # The project's packages (torch, TRL, …) from .venv, after mutmut's own; not grpo_launch itself, which mutmut
  # imports from its mutated copy.
  site=$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mine=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$site" >"$mine/zz-grpo-launch-venv.pth"
fi

TREE=$WORK/tree
mkdir -p "$TREE"
# Fresh sources, tests and mutants each run: mutmut 3.8 keeps a mutant's result while its code is unchanged, even
# when the tests changed (MUTMUT_KEEP=1 keeps the previous results).
rm -rf "$TREE/src" "$TREE/tests" "$TREE/recipes" "$TREE/scripts" "$TREE/.cache"
[ "${MUTMUT_KEEP:-0}" = 1 ] || rm -rf "$TREE/mutants"
cp -r "$ROOT/src" "$ROOT/tests" "$ROOT/recipes" "$ROOT/scripts" "$ROOT/pyproject.toml" "$TREE/"
mkdir -p "$TREE/.cache"
bash -c "cd '$ROOT' && .venv/bin/python scripts/make_tiny_assets.py .cache/tiny" >/dev/null  # some tests read it
cp -r "$ROOT/.cache/tiny" "$TREE/.cache/"
find "$TREE" -name __pycache__ -prune -exec rm -rf {} +
cat >"$TREE/setup.cfg" <<'CFG'
[mutmut]
source_paths=src/
only_mutate=
    src/grpo_launch/planning/batch_layout.py
    src/grpo_launch/planning/layout_fixes.py
    src/grpo_launch/planning/placement.py
    src/grpo_launch/planning/splits/allowed.py
    src/grpo_launch/planning/splits/refusals.py
also_copy=
    recipes/
    scripts/
    .cache/
pytest_add_cli_args_test_selection=
    tests/test_layout.py
    tests/test_layout_mutants.py
    tests/test_plan.py
    tests/test_fixes.py
    tests/test_published_cases.py
pytest_add_cli_args=
    -p
    no:cacheprovider
    -q
    -x
CFG
cd "$TREE"
# No PYTHONPATH: mutmut puts its mutated copy of src/ first.
env -u PYTHONPATH "$WORK/venv/bin/mutmut" run --max-children "${MUTMUT_CHILDREN:-1}" "$@"
if [ $# -gt 0 ]; then
  # Each named mutant's status, one per line ("NAME: killed" / "NAME: survived").
  env -u PYTHONPATH "$WORK/venv/bin/mutmut" results --all true | grep -F -f <(printf '%s\n' "$@" | sed -E '/\*/!s/$/:/; s/\*.*//; s/^/    /')
else
  env -u PYTHONPATH "$WORK/venv/bin/mutmut" results
fi
