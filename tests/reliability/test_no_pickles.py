"""No artifact can run code: nothing in the project unpickles, and Dagster's pickling IO manager is
not used. (The world model's and the IO manager's own tests plant hostile pickles where the old
code read them and show they are refused; this one keeps new code from reading one.)"""

from __future__ import annotations

import re

from conductor_pipeline.paths import PROJECT_ROOT

PACKAGES = ("assets", "conductor_pipeline", "resources", "scripts", "benchmarks")
# Calls that unpickle (or hand a file to an unpickler), and Dagster's pickling IO managers.
UNPICKLING = re.compile(
    r"\b(?:pickle|cPickle|dill|cloudpickle|joblib)\.loads?\(|\bshelve\.open\(|\bmarshal\.loads?\("
    r"|\btorch\.load\((?![^)]*weights_only\s*=\s*True)|\bnp\.load\((?![^)]*allow_pickle\s*=\s*False)"
    r"|\bFilesystemIOManager\(|[=:]\s*fs_io_manager\b|\(\s*UPathIOManager\s*\)"
)


def test_no_project_module_unpickles_anything() -> None:
    found = [
        f"{path.relative_to(PROJECT_ROOT)}:{number}: {line.strip()}"
        for package in PACKAGES
        for path in sorted((PROJECT_ROOT / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if UNPICKLING.search(line)
    ]
    assert found == []


def test_the_pattern_catches_what_it_is_for() -> None:  # a guard that cannot fail guards nothing
    for line in ("model = pickle.loads(data)", "joblib.load(path)", "torch.load(f)", "np.load(p)",
                 '"io_manager": dg.FilesystemIOManager()', "import dill; dill.load(f)"):
        assert UNPICKLING.search(line), line
    for line in ("torch.load(f, weights_only=True)", "np.load(p, allow_pickle=False)", "pickle.dumps(x)"):
        assert not UNPICKLING.search(line), line
