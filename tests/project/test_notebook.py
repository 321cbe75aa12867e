"""The walkthrough notebook runs top to bottom and draws its figures.

It runs with its small workload (`QUICK = True`, injected after the cell tagged "parameters", as papermill
does) in a kernel that is this interpreter: a kernelspec is written for it into a temporary directory
that JUPYTER_PATH puts first, so a `python3` kernelspec elsewhere on the machine cannot pick another
Python without the project installed.
"""

import json
import re
import sys
from pathlib import Path

import nbformat
import pytest
from ipykernel.kernelspec import install as install_kernelspec
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "walkthrough.ipynb"
KERNEL = "voicepipe-walkthrough-test"
FIGURES = 7  # the turn's timeline, the shards, the pool, the steps, the sweep, the policies, the GPU sweep


def parameter_cell(nb: nbformat.NotebookNode) -> int:
    tagged = [i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    return tagged[0]


def inject(nb: nbformat.NotebookNode, **values: object) -> None:
    """Override parameters in a cell right after the parameters cell."""
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    nb.cells.insert(parameter_cell(nb) + 1,
                    nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))


def outputs(nb: nbformat.NotebookNode) -> list[dict]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]


def test_stored_without_outputs() -> None:
    """Outputs (figures, embedded audio) would bloat the repository and go stale."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert not outputs(nb)
    assert all(cell.get("execution_count") is None for cell in nb.cells if cell.cell_type == "code")
    assert "QUICK = False" in nb.cells[parameter_cell(nb)].source


def test_each_section_says_what_to_look_for() -> None:
    """Every numbered section has a markdown cell telling the reader what its output shows."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    sections: dict[str, list[str]] = {}
    current = None
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        heading = next((line for line in cell.source.splitlines() if re.match(r"## \d+\.", line)), None)
        current = heading or current
        if current:
            sections.setdefault(current, []).append(cell.source)
    assert len(sections) == 7, list(sections)
    missing = [name for name, texts in sections.items() if not any("What to look for" in t for t in texts)]
    assert not missing, missing


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> nbformat.NotebookNode:
    prefix = tmp_path_factory.mktemp("jupyter")
    install_kernelspec(kernel_name=KERNEL, prefix=str(prefix))
    spec = prefix / "share" / "jupyter" / "kernels" / KERNEL / "kernel.json"
    assert json.loads(spec.read_text())["argv"][0] == sys.executable
    nb = nbformat.read(NOTEBOOK, as_version=4)
    inject(nb, QUICK=True)
    nb.cells.append(nbformat.v4.new_code_cell("import sys\nprint(sys.executable, end='')"))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
        env.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend must draw the figures
        client = NotebookClient(nb, kernel_name=KERNEL, timeout=600, allow_errors=False,
                                resources={"metadata": {"path": str(NOTEBOOK.parent)}})
        client.execute()  # raises CellExecutionError, with the cell and its traceback, on the first error
    return nb


def test_runs_in_this_interpreter(executed: nbformat.NotebookNode) -> None:
    last = executed.cells[-1].outputs
    assert last and last[0]["text"] == sys.executable


def test_no_cell_errors(executed: nbformat.NotebookNode) -> None:
    errors = [out for out in outputs(executed) if out["output_type"] == "error"]
    assert not errors, errors[0]["evalue"] if errors else ""
    assert all(cell.get("execution_count") for cell in executed.cells if cell.cell_type == "code")


def test_draws_figures_tables_and_audio(executed: nbformat.NotebookNode) -> None:
    data = [out.get("data", {}) for out in outputs(executed)]
    figures = [d for d in data if "image/png" in d]
    assert len(figures) >= FIGURES, f"{len(figures)} figures drawn"
    html = [d["text/html"] for d in data if "text/html" in d]
    assert sum("<audio" in h for h in html) == 2, "the question and the reply should both be playable"
    assert sum("<table" in h for h in html) >= 5


def test_turn_heard_and_answered(executed: nbformat.NotebookNode) -> None:
    text = "".join(out.get("text", "") for out in outputs(executed) if out["output_type"] == "stream")
    heard = next(line for line in text.splitlines() if line.startswith("heard:"))
    answered = next(line for line in text.splitlines() if line.startswith("answered:"))
    assert "capital" in heard.lower() and "france" in heard.lower()
    assert answered.removeprefix("answered:").strip()


def test_prompt_cut_into_shards_over_several_steps(executed: nbformat.NotebookNode) -> None:
    """The shards figure draws what its title says: several shards, carried by more than one step."""
    text = "".join(out.get("text", "") for out in outputs(executed) if out["output_type"] == "stream")
    found = re.search(r"(\d+) prompt tokens, shard_tokens=(\d+).*: (\d+) shards in (\d+) steps", text)
    assert found, "the shards cell should say how many shards and steps the prompt took"
    tokens, shard, shards, steps = map(int, found.groups())
    assert shards == -(-tokens // shard) and shards > 1
    assert 1 < steps <= shards


def test_knobs_simulated_on_a_gpu(executed: nbformat.NotebookNode) -> None:
    """Section 7 ran the simulator over its grid (2 x 2 in the quick run)."""
    text = "".join(out.get("text", "") for out in outputs(executed) if out["output_type"] == "stream")
    found = re.search(r"(\d+) simulations in \d+ s", text)
    assert found and int(found.group(1)) == 4
