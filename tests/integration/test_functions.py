"""current.torch.run with a Python function: return values and original exceptions."""

import pytest

from .calls import flow_run, once_per_pytest_run
from .helpers import Gang, check_failure_screen, output

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def function_calls(tmp_path_factory):
    """One flow, two calls ("sum" then "module"), each call's returns kept by its
    mode: the two success-path tests below read their own (calls.py: a flow
    costs about 15 CPU-s)."""
    kept = once_per_pytest_run(tmp_path_factory, "function-calls", lambda: flow_run(
        tmp_path_factory, "function-calls", "--mode", "sum,module", flow="function_flow.py"))
    yield Gang(kept["tmp"]), kept


def _all_returns(gang, mode):
    return gang.client(
        "r = Flow('FunctionFlow').latest_run['join'].task['all_returns_by_mode'].data[%r]\n"
        "result = {str(k): v for k, v in r.items()}" % mode
    )


def test_function_in_the_flow_file_returns_rank0_value_as_artifact(function_calls):
    gang, run = function_calls
    assert run["returncode"] == 0, run["text"][-4000:]
    rank0 = gang.client("result = Flow('FunctionFlow').latest_run['join'].task['rank0_by_mode'].data['sum']")
    assert rank0 == {"rank": 0, "sum": 60}  # 10 * (0 + 1 + 2 + 3)
    returns = _all_returns(gang, "sum")
    assert sorted(returns) == ["0", "1", "2", "3"]
    assert all(v["sum"] == 60 and v["rank"] == int(k) for k, v in returns.items())


def test_function_in_a_module_gets_positional_args_and_torchrun_env(function_calls):
    gang, run = function_calls
    assert run["returncode"] == 0, run["text"][-4000:]
    returns = _all_returns(gang, "module")
    assert sorted(returns) == ["0", "1", "2", "3"]
    for k, v in returns.items():
        assert v == {"tag": "tagged", "rank": int(k), "world": 4, "local_rank": v["local_rank"]}
        assert v["local_rank"] in (0, 1)


def test_function_raising_surfaces_the_original_exception_with_its_rank(gang):
    proc = gang.run("--mode", "raise", flow="function_flow.py", timeout=180)
    text = output(proc)
    assert proc.returncode != 0
    # The task that ran rank 1 fails with the rank's own exception type, which
    # Metaflow prints as the failure block: the rank's frames, none of ours.
    check_failure_screen(text, "@torchrun: a rank raised ValueError", "First failure: node 0 (", "rank 1",
                         "in raise_on", "ValueError: bad value on purpose", once='raise ValueError("bad value on purpose")')


def test_lambda_is_refused_with_a_clear_message(gang, tmp_path):
    flow = tmp_path / "lambda_flow.py"
    flow.write_text(
        "from metaflow import FlowSpec, current, step, torchrun\n"
        "class LambdaFlow(FlowSpec):\n"
        "    @step\n"
        "    def start(self):\n"
        "        self.next(self.train, num_parallel=1)\n"
        "    @torchrun\n"
        "    @step\n"
        "    def train(self):\n"
        "        current.torch.run(entrypoint=lambda: 1)\n"
        "        self.next(self.join)\n"
        "    @step\n"
        "    def join(self, inputs):\n"
        "        self.next(self.end)\n"
        "    @step\n"
        "    def end(self):\n"
        "        pass\n"
        "if __name__ == '__main__':\n"
        "    LambdaFlow()\n"
    )
    proc = gang.run(flow=str(flow), timeout=120)
    text = output(proc)
    assert proc.returncode != 0
    assert "is not a module-level function" in text
