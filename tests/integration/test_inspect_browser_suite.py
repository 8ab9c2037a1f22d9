"""inspect_ai's own tests/tools/test_web_browser.py, ported to our `web_browser()` with the
least change.

The five tests keep inspect's structure, tool-call scripts and assertions (the same
strings, two spaces before `[url: ...]` included). What changed, and only that:

- `from inspect_ai.tool import web_browser` -> `from sandbox_tools.inspect import
  web_browser` (same tool names, parameters and results);
- the sandbox: inspect's `docker` sandbox with its compose file
  (test_inspect_tool_support.yaml: a python image beside the aisiuk/inspect-tool-support
  browser image) -> our `docker_sdk` sandbox on the offline-built Debian bookworm image
  with python3 (`python_image`), network "none"; `web_browser_sandbox()` takes that image;
- the internet sites -> small pages served inside the container on 127.0.0.1:8000 by
  python3's http.server (its SimpleHTTPRequestHandler, extensionless files served as
  HTML), started by a solver (`serve_offline_web()`) placed before `use_tools`. Each
  site is a folder named after its host, so
  https://github.com/UKGovernmentBEIS/inspect_ai becomes
  http://127.0.0.1:8000/github.com/UKGovernmentBEIS/inspect_ai, and so on; the pages
  (SITE below) reproduce what the tests look at: the repository page's "Skip to content"
  link to #start-of-content, the docs site's "Anchor" link to #welcome (and a "Solvers"
  link), selenium's web form with its "Submit" button and "Form submitted" page,
  selenium's page whose "Open new window" link opens simple_page.html in a new window
  (beside an iframe showing that page, as selenium's has), and a search page for
  www.google.com. The URLs in the tool calls, sample inputs and assertions are the
  local ones;
- inspect's test helpers are not importable here: `get_tool_call`/`get_tool_response`
  and `flaky_retry` are written again below, doing what inspect's do;
  `@skip_if_no_docker` and `@pytest.mark.slow` become this module's `docker` marker
  (and the `docker_engine` fixture, through `python_image`);
- every mockllm output carries a usage (mockllm would otherwise fetch a tokenizer
  online): `custom_outputs` lists and generators are wrapped by `with_usage()`;
- `eval(...)` gets `log_dir=str(tmp_path)`; the runtime and the browser add-on come from
  this session's builds (`built_artifacts`, `built_browser`), put in one directory with
  their build records and named by SANDBOX_TOOLS_DIST;
- test_web_browser_click and test_web_browser_input need a real OpenAI model
  (openai/gpt-4o): they are skipped, as inspect skips them, without the openai package
  and OPENAI_API_KEY (no model service is reachable here).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import os
import re
from collections.abc import Callable
from itertools import count
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest

from sandbox_tools.platforms import Arch
from tests.support import get_tool_call, get_tool_response

pytest.importorskip("inspect_ai", reason="the [inspect] extra is not installed")

from inspect_ai import Task, eval
from inspect_ai._util.content import ContentText
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.model._chat_message import (
    ChatMessage,
    ChatMessageTool,
)
from inspect_ai.model._generate_config import GenerateConfig
from inspect_ai.solver import Generate, TaskState, generate, solver, use_tools
from inspect_ai.tool._tool_choice import ToolChoice
from inspect_ai.tool._tool_info import ToolInfo
from inspect_ai.util import sandbox

from sandbox_tools.inspect import web_browser
from sandbox_tools.inspect.docker_env import DockerSdkConfig

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]
HOST_ARCH = Arch.parse(os.uname().machine)

# -- the sites, offline, inside the container ---------------------------------------------

WEB = "http://127.0.0.1:8000"
SITE_DIR = "/tmp/site"
SERVER = f"""\
import functools, http.server
http.server.SimpleHTTPRequestHandler.extensions_map[""] = "text/html"
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory="{SITE_DIR}")
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), handler).serve_forever()
"""
_FILLER = "".join(f"<p>Line {n} of the README, to scroll through.</p>\n" for n in range(1, 121))

SITE = {
    # https://github.com/UKGovernmentBEIS/inspect_ai (no trailing slash: a file)
    "github.com/UKGovernmentBEIS/inspect_ai": f"""<!DOCTYPE html>
<html><head><title>UKGovernmentBEIS/inspect_ai: Inspect</title></head><body>
<a href="#start-of-content">Skip to content</a>
<header><nav><a href="/github.com/">Sign in</a></nav></header>
<div id="start-of-content"></div>
<main>
<h1>inspect_ai</h1>
<p>Inspect: A framework for large language model evaluations</p>
{_FILLER}</main>
</body></html>
""",
    # https://inspect.aisi.org.uk/
    "inspect.aisi.org.uk/index.html": f"""<!DOCTYPE html>
<html><head><title>Inspect</title></head><body>
<nav><a href="solvers.html">Solvers</a> <a href="tools.html">Tools</a></nav>
<main>
<h2 id="welcome">Welcome <a class="anchorjs-link" aria-label="Anchor" href="#welcome"
  style="padding-left: 0.375em">#</a></h2>
<p>Welcome to Inspect, a framework for large language model evaluations.</p>
{_FILLER}</main>
</body></html>
""",
    "inspect.aisi.org.uk/solvers.html": """<!DOCTYPE html>
<html><head><title>Solvers - Inspect</title></head><body>
<main><h1>Solvers</h1><p>Solvers are the heart of Inspect evaluations.</p></main>
</body></html>
""",
    # https://www.selenium.dev/selenium/web/web-form.html and the page it submits to
    "www.selenium.dev/selenium/web/web-form.html": """<!DOCTYPE html>
<html><head><title>Web form</title></head><body>
<main>
<h1>Web form</h1>
<form method="get" action="submitted-form.html">
  <label>Text input <input type="text" name="my-text" id="my-text-id"></label><br>
  <label>Password <input type="password" name="my-password"></label><br>
  <label>Textarea <textarea name="my-textarea" rows="3"></textarea></label><br>
  <label>Dropdown (select)
    <select name="my-select"><option selected>Open this select menu</option>
      <option value="1">One</option><option value="2">Two</option></select></label><br>
  <label><input type="checkbox" name="my-check" checked> Checked checkbox</label><br>
  <button type="submit">Submit</button>
</form>
</main>
</body></html>
""",
    "www.selenium.dev/selenium/web/submitted-form.html": """<!DOCTYPE html>
<html><head><title>Web form - target page</title></head><body>
<main><h1>Form submitted</h1><p id="message">Received!</p></main>
</body></html>
""",
    # https://www.selenium.dev/selenium/web/window_switching_tests/page_with_frame.html:
    # its link opens simple_page.html in a window of its own; its iframe shows that page
    # too (so the new window is told from this one by the link's absence).
    "www.selenium.dev/selenium/web/window_switching_tests/page_with_frame.html": """<!DOCTYPE html>
<html><head><title>A page with a frame and a link to a new window</title></head><body>
<p><a id="new-window-link" target="newWindow" href="simple_page.html">Open new window</a></p>
<div><iframe name="myframe" src="simple_page.html" width="400" height="200"></iframe></div>
</body></html>
""",
    "www.selenium.dev/selenium/web/window_switching_tests/simple_page.html": """<!DOCTYPE html>
<html><head><title>Simple Page</title></head><body>
<div>Simple page with simple test.</div>
</body></html>
""",
    # https://www.google.com and its results page
    "www.google.com/index.html": """<!DOCTYPE html>
<html><head><title>Google</title></head><body>
<main><form action="search" method="get" role="search">
  <textarea name="q" title="Search" aria-label="Search" rows="1"></textarea>
  <input type="submit" value="Google Search">
</form></main>
</body></html>
""",
    "www.google.com/search": """<!DOCTYPE html>
<html><head><title>Search results - Google</title></head><body>
<main><h1>Results</h1><p id="query"></p></main>
<script>document.getElementById("query").textContent =
  new URLSearchParams(location.search).get("q");</script>
</body></html>
""",
}


@solver
def serve_offline_web() -> Any:
    """The sites above, served inside the sample's container on 127.0.0.1:8000."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        for path, page in SITE.items():
            await sandbox().write_file(f"{SITE_DIR}/{path}", page)
        await sandbox().write_file("/tmp/site-server.py", SERVER)
        started = await sandbox().exec(
            ["sh", "-c", "nohup python3 /tmp/site-server.py >/tmp/site-server.log 2>&1 &"]
        )
        assert started.returncode == 0, started.stderr
        ready = await sandbox().exec(
            [
                "python3",
                "-c",
                "import time, urllib.request\n"
                "for _ in range(100):\n"
                "    try:\n"
                f"        urllib.request.urlopen('{WEB}/', timeout=1); break\n"
                "    except OSError:\n"
                "        time.sleep(0.1)\n"
                "else:\n"
                "    raise SystemExit('the site server did not start')\n",
            ]
        )
        assert ready.returncode == 0, ready.stderr
        return state

    return solve


@pytest.fixture
def image(python_image: str, browser_dist: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The Debian image with python3; acquisition finds the builds in `browser_dist`."""
    monkeypatch.setenv("SANDBOX_TOOLS_DIST", str(browser_dist))
    return python_image


def web_browser_sandbox(image: str) -> tuple[str, DockerSdkConfig]:
    return ("docker_sdk", DockerSdkConfig(image=image))


# -- what inspect's test helpers give its tests, written again ---------------------------

USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


def with_usage(outputs: Any) -> Any:
    """mockllm's outputs, each with a usage (a list, or a generator function)."""
    if callable(outputs):

        def generator(*args: Any) -> ModelOutput:
            output: ModelOutput = outputs(*args)
            output.usage = USAGE
            return output

        return generator
    for output in outputs:
        output.usage = USAGE
    return outputs


F = TypeVar("F", bound=Callable[..., Any])


def flaky_retry(max_retries: int) -> Callable[[F], F]:
    """Run the test again on failure, up to `max_retries` times (skips are not retried)."""

    def decorator(func: F) -> F:
        assert not asyncio.iscoroutinefunction(func)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for attempt in range(max_retries + 1):
                try:
                    return func(*args, **kwargs)
                except (pytest.skip.Exception, pytest.xfail.Exception):
                    raise
                except (Exception, pytest.fail.Exception):
                    if attempt == max_retries:
                        raise

        return wrapper  # type: ignore[return-value]

    return decorator


skip_if_no_openai = pytest.mark.skipif(
    importlib.util.find_spec("openai") is None or os.environ.get("OPENAI_API_KEY") is None,
    reason="needs a real OpenAI model (openai/gpt-4o: the openai package and OPENAI_API_KEY); "
    "no model service is reachable here",
)


# -- inspect's tests ----------------------------------------------------------------------


def find_element_id(input: list[ChatMessage], pattern: str) -> int:
    r"""Finds an element id from the accessibility tree in the most recent tool message.

    Args:
        input: The conversation messages.
        pattern: Regex pattern to match after the element id bracket (e.g. r'button\s*"Submit"').

    Returns:
        The integer element id.
    """
    most_recent_message = input[-1]
    assert isinstance(most_recent_message, ChatMessageTool)
    if isinstance(most_recent_message.content, str):
        text = most_recent_message.content
    else:
        at_content = most_recent_message.content[-1]
        assert isinstance(at_content, ContentText)
        text = at_content.text
    match = re.search(rf"\[(\d+)\]\s*{pattern}", text)
    assert match, f"Could not find element matching {pattern} in accessibility tree"
    return int(match.group(1))


def test_web_browser_navigation(image: str, tmp_path: Path) -> None:
    task = Task(
        dataset=[Sample(input="Please use the web_browser tool")],
        solver=[serve_offline_web(), use_tools(web_browser()), generate()],
        sandbox=web_browser_sandbox(image),
    )

    log = eval(
        task,
        model=get_model(
            "mockllm/model",
            custom_outputs=with_usage(
                [
                    ModelOutput.for_tool_call(
                        model="mockllm/model",
                        tool_name="web_browser_go",
                        tool_arguments={"url": f"{WEB}/github.com/UKGovernmentBEIS/inspect_ai"},
                    ),
                    ModelOutput.for_tool_call(
                        model="mockllm/model",
                        tool_name="web_browser_scroll",
                        tool_arguments={"direction": "down"},
                    ),
                    ModelOutput.for_tool_call(
                        model="mockllm/model",
                        tool_name="web_browser_scroll",
                        tool_arguments={"direction": "up"},
                    ),
                    ModelOutput.for_tool_call(
                        model="mockllm/model",
                        tool_name="web_browser_go",
                        tool_arguments={"url": f"{WEB}/inspect.aisi.org.uk/"},
                    ),
                    ModelOutput.for_tool_call(
                        model="mockllm/model",
                        tool_name="web_browser_back",
                        tool_arguments={},
                    ),
                    ModelOutput.for_tool_call(
                        model="mockllm/model",
                        tool_name="web_browser_forward",
                        tool_arguments={},
                    ),
                    ModelOutput.for_tool_call(
                        model="mockllm/model",
                        tool_name="web_browser_refresh",
                        tool_arguments={},
                    ),
                    ModelOutput.from_content(
                        model="mockllm/model", content="We are all done here."
                    ),
                ]
            ),
        ),
        log_dir=str(tmp_path),
    )[0]

    def is_inspect_website(page: str) -> bool:
        return 'link "Anchor"  [url: http://127.0.0.1:8000/inspect.aisi.org.uk/#welcome]' in page

    def is_inspect_repo(page: str) -> bool:
        return (
            'link "Skip to content"  [url: http://127.0.0.1:8000/github.com/UKGovernmentBEIS/inspect_ai#start-of-content]'
            in page
        )

    assert log.samples

    def check_tool_call_page(tool: str, page: Literal["website", "repo"]) -> None:
        call = get_tool_call(log.samples[0].messages, tool)
        assert call
        response = get_tool_response(log.samples[0].messages, call)
        assert response
        if page == "website":
            assert is_inspect_website(response.text)
        elif page == "repo":
            assert is_inspect_repo(response.text)

    check_tool_call_page("web_browser_go", "repo")
    check_tool_call_page("web_browser_back", "repo")
    check_tool_call_page("web_browser_forward", "website")
    check_tool_call_page("web_browser_refresh", "website")


def test_web_browser_type_submit(image: str, tmp_path: Path) -> None:
    call_number_gen = count()

    def custom_outputs_generator(
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        match next(call_number_gen):
            case 0:
                return ModelOutput.for_tool_call(
                    model="mockllm/model",
                    tool_name="web_browser_go",
                    tool_arguments={"url": f"{WEB}/www.selenium.dev/selenium/web/web-form.html"},
                )
            case 1:
                return ModelOutput.for_tool_call(
                    model="mockllm/model",
                    tool_name="web_browser_type_submit",
                    tool_arguments={
                        "element_id": submit_id(input),
                        "text": "A submission",
                    },
                )
            case _:
                return ModelOutput.from_content(
                    model="mockllm/model", content="We are all done here."
                )

    def submit_id(input: list[ChatMessage]) -> int:
        """Fishes out the submit button element id from what should be the accessibility tree returned by the tool"""  # noqa: E501
        return find_element_id(input, r"button\s*\"Submit\"")

    task = Task(
        dataset=[Sample(input="Please use the web_browser tool")],
        solver=[serve_offline_web(), use_tools(web_browser()), generate()],
        sandbox=web_browser_sandbox(image),
    )

    log = eval(
        task,
        model=get_model(
            "mockllm/model",
            custom_outputs=with_usage(custom_outputs_generator),
        ),
        log_dir=str(tmp_path),
    )[0]

    assert log.samples

    assert "Form submitted" in log.samples[0].messages[4].text


@flaky_retry(max_retries=3)
def test_web_browser_open_new_page(image: str, tmp_path: Path) -> None:
    call_number_gen = count()

    def custom_outputs_generator(
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        match next(call_number_gen):
            case 0:
                return ModelOutput.for_tool_call(
                    model="mockllm/model",
                    tool_name="web_browser_go",
                    tool_arguments={
                        "url": f"{WEB}/www.selenium.dev/selenium/web/window_switching_tests/page_with_frame.html"  # noqa: E501
                    },
                )
            case 1:
                return ModelOutput.for_tool_call(
                    model="mockllm/model",
                    tool_name="web_browser_click",
                    tool_arguments={
                        "element_id": find_element_id(input, r'link\s*"Open new window"'),
                    },
                )
            case _:
                return ModelOutput.from_content(
                    model="mockllm/model", content="We are all done here."
                )

    task = Task(
        dataset=[Sample(input="Please use the web_browser tool")],
        solver=[serve_offline_web(), use_tools(web_browser()), generate()],
        sandbox=web_browser_sandbox(image),
    )

    log = eval(
        task,
        model=get_model(
            "mockllm/model",
            custom_outputs=with_usage(custom_outputs_generator),
        ),
        log_dir=str(tmp_path),
    )[0]

    assert log.samples

    assert "Simple page with simple test." in log.samples[0].messages[4].text
    assert "Open new window" not in log.samples[0].messages[4].text


@skip_if_no_openai
def test_web_browser_click(image: str, tmp_path: Path) -> None:
    task = Task(
        dataset=[
            Sample(
                input="Please use the web browser tool to navigate to http://127.0.0.1:8000/inspect.aisi.org.uk/. Then, once there, use the web_browser_click tool to click the link to the documentation on Solvers."  # noqa: E501
            )
        ],
        solver=[serve_offline_web(), use_tools(web_browser()), generate()],
        sandbox=web_browser_sandbox(image),
    )

    log = eval(task, model="openai/gpt-4o", log_dir=str(tmp_path))[0]

    click_call = get_tool_call(log.samples[0].messages, "web_browser_click")
    assert click_call
    click_response = get_tool_response(log.samples[0].messages, click_call)
    assert click_response


@skip_if_no_openai
def test_web_browser_input(image: str, tmp_path: Path) -> None:
    task = Task(
        dataset=[
            Sample(
                input="Please use the web browser tool to navigate to http://127.0.0.1:8000/www.google.com/. Then, once there, use the page's search interface to search for 'large language models'"  # noqa: E501
            )
        ],
        solver=[serve_offline_web(), use_tools(web_browser()), generate()],
        sandbox=web_browser_sandbox(image),
    )

    log = eval(task, model="openai/gpt-4o", log_dir=str(tmp_path))[0]

    type_call = get_tool_call(log.samples[0].messages, "web_browser_type_submit")
    assert type_call
