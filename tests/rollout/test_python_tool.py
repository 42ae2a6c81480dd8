"""The sandboxed python tool: hostile calls change nothing on the host and come back as error observations."""

import http.server
import json
import os
import threading

import pytest

from coati.rollout.env import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolEnv
from coati.rollout.python_tool import PythonToolOptions, make_python_tool
from rewards.code import SandboxUnavailable, check_sandbox_available


@pytest.fixture(scope="module")
def python_tool():
    try:
        check_sandbox_available()
    except SandboxUnavailable as err:
        pytest.skip(str(err))
    tool = make_python_tool(PythonToolOptions(cpu_time_s=1, wall_time_s=3.0, max_output_chars=400))
    yield tool
    tool.close()


def _call(code: str) -> str:
    return TOOL_CALL_OPEN + json.dumps({"name": "python", "arguments": {"code": code}}) + TOOL_CALL_CLOSE


def _env(tool):
    class Env(ToolEnv):
        tools = [tool]

    env = Env()
    env.reset(None)
    return env


def test_plain_call_returns_stdout(python_tool):
    result = _env(python_tool).step("let me compute " + _call("print(123 * 456)"))
    assert not result.done and "56088" in result.observation and result.info["tool_error"] is False


def test_hostile_calls_change_nothing_and_the_episode_continues(python_tool, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    os.chmod(secret, 0o600)
    target = tmp_path / "written_by_model"
    served = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            served.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    env = _env(python_tool)
    hostile = {
        "fork bomb": "import os\nwhile True:\n    os.fork()",
        "network": f"import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:{port}/x', timeout=2).read())",
        "write outside": f"open({str(target)!r}, 'w').write('x')\nprint('wrote')",
        "read secret": f"print(open({str(secret)!r}).read())",
        "read root": "import os\nprint(os.listdir('/root'))",
        "infinite loop": "while True:\n    pass",
        "memory": "x = bytearray(1 << 34)",
    }
    try:
        for name, code in hostile.items():
            result = env.step(_call(code))
            assert not result.done, name
            assert result.info["tool_error"] is True, (name, result.observation)
            assert "<tool_response>" in result.observation and "error" in result.observation, name
            assert "TOPSECRET" not in result.observation
    finally:
        server.shutdown()
    assert not target.exists() and served == [] and secret.read_text() == "TOPSECRET"
    assert env.step(_call("print('still fine')")).observation.strip().endswith("still fine\n</tool_response>")


def test_bad_calls_are_observations(python_tool):
    env = _env(python_tool)
    for text in (TOOL_CALL_OPEN + "not json" + TOOL_CALL_CLOSE,
                 TOOL_CALL_OPEN + '{"name": "rm", "arguments": {}}' + TOOL_CALL_CLOSE,
                 TOOL_CALL_OPEN + '{"name": "python", "arguments": {"code": 3}}' + TOOL_CALL_CLOSE,
                 TOOL_CALL_OPEN + '{"name": "python", "arguments": {}}' + TOOL_CALL_CLOSE):
        result = env.step(text)
        assert not result.done and result.info["tool_error"] and "error:" in result.observation
