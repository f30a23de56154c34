"""The web benchmark without a harness: its tasks load, its apps serve pages and keep state, and every task's
checks score an agent that solves it 1.0 and one that fails it below 1.0 (from the app's real final state)."""

from __future__ import annotations

import pytest

from forgerl.runners.grading import GradingError
from forgerl.runners.kinds import web
from forgerl.runners.loader import load_tasks
from forgerl.runners.tasks import TaskError

from web_fixtures import (SOLUTIONS, WEB_BENCH, act, app_state, grade_states, http, run_solution, served,
                          with_checks)


@pytest.fixture(scope="module")
def tasks() -> dict[str, web.WebTask]:
    return {t.id: t for t in load_tasks(WEB_BENCH)}


def test_benchmark_loads_as_web_tasks(tasks):
    assert len(tasks) >= 10 and set(tasks) == set(SOLUTIONS)
    assert all(isinstance(t, web.WebTask) for t in tasks.values())
    assert {t.task_type for t in tasks.values()} == {"information", "transaction"}
    assert {a.name for t in tasks.values() for a in t.apps} == {"shop", "travel"}
    one = WEB_BENCH / "tasks" / "travel-cancel-trip.toml"
    assert web.matches(one) and web.matches(WEB_BENCH) and web.matches(WEB_BENCH / "tasks")
    assert [t.id for t in load_tasks(one)] == ["travel-cancel-trip"]
    shop = tasks["shop-buy-sencha"].apps[0]
    service = tasks["shop-buy-sencha"].services[0]
    assert (shop.port, service.port, service.argv[-2:]) == (8101, 8101, ("--port", "8101"))
    assert (service.health_path, service.state_paths) == (web.HEALTH_PATH, (web.STATE_PATH,))
    assert tasks["shop-buy-sencha"].mcp_servers == (web.PLAYWRIGHT_MCP,)


@pytest.mark.parametrize("task_id", sorted(SOLUTIONS))
def test_checks_score_solved_high_and_failed_low(task_id, tasks, tmp_path):
    task = tasks[task_id]
    steps, answer, bad_steps, bad_answer = SOLUTIONS[task_id]
    solved = run_solution(task, steps, answer, tmp_path)
    assert solved and all(v == 1.0 for v in solved.values()), solved
    failed = run_solution(task, bad_steps, bad_answer, tmp_path)
    assert set(failed) == set(solved) and task.reward(failed).reward < 1.0, failed
    assert not task.passes(task.reward(failed).reward) and task.passes(task.reward(solved).reward)


def test_apps_validate_forms_and_hide_state_from_pages(tasks, tmp_path):
    shop, travel = tasks["shop-buy-sencha"].apps[0], tasks["travel-cancel-trip"].apps[0]
    with served(shop) as url:
        pages = [http(url + p)[1] for p in ("/", "/search?q=tea", "/product/TEA-01", "/cart", "/orders")]
        assert not any(web.STATE_PATH in page for page in pages)
        act(url, [("/cart/add", {"sku": "TEA-01", "qty": "1"})])
        status, page = http(url + "/checkout", {"name": "", "address": "x", "city": "y", "zip": "12"})
        assert status == 400 and "Full name is required." in page and "ZIP code must be 5 digits." in page
        assert http(url + "/cart/add", {"sku": "TEA-03", "qty": "1"})[0] == 400  # out of stock
        state = app_state(url)
        assert state["cart"] == {"TEA-01": 1} and len(state["orders"]) == 2
        assert [r["path"] for r in state["requests"]][:2] == ["/", "/search"]
    with served(travel) as url:
        status, page = http(url + "/flights?origin=LIS&destination=LIS&date=2026-13-01&passengers=9")
        assert status == 400 and "must be different" in page and "YYYY-MM-DD" in page and "1 to 6" in page
        status, page = http(url + "/book/TP610", {"date": "2026-12-20", "passengers": "1", "first_name": "A",
                                                  "last_name": "B", "email": "not-an-address"})
        assert status == 400 and "valid e-mail" in page and len(app_state(url)["bookings"]) == 2


def test_missing_state_or_a_broken_check_is_not_a_zero(tasks, tmp_path):
    task = tasks["travel-cancel-trip"]
    with pytest.raises(GradingError, match="no state was collected from the app.s. travel"):
        grade_states(task, {}, "Cancelled.", tmp_path)
    with pytest.raises(GradingError, match=r"travel \(HTTP 500\)"):
        grade_states(task, {"travel": {"error": "HTTP 500"}}, "Cancelled.", tmp_path)
    broken = with_checks(task, {"name": "typo", "expect": "travel['no_such_key']"})
    with pytest.raises(GradingError, match="no_such_key"):
        grade_states(broken, {"travel": {"bookings": []}}, "", tmp_path)


def test_trajectory_reaches_the_checks(tasks, tmp_path):
    from forgerl.schema.messages import Message, Part

    said = [[Message("assistant", (Part("tool_call", tool_name="browser_click", call_id="c1",
                                        arguments='{"element": "Cancel booking", "ref": "e12"}'),))],
            [Message("assistant", (Part("text", text='{"memory": "", "action": [{"click": {"index": 4}}, '
                                                     '{"done": {"text": "Cancelled.", "success": true}}]}'),))],
            [Message("assistant", (Part("text", text="no action here"),))]]
    task = with_checks(tasks["travel-cancel-trip"],
                       {"name": "clicked",
                        "expect": "[a['name'] for a in actions] == ['browser_click', 'click', 'done']"},
                       {"name": "two turns", "expect": "steps == 2"})
    assert grade_states(task, {"travel": {}}, "x", tmp_path, said) == {"clicked": 1.0, "two turns": 1.0}


@pytest.mark.parametrize("name, body, message", [
    ("bad-app.toml", 'id = "x"\nprompt = "p"\napps = ["bank"]\n[[checks]]\nname = "c"\nexpect = "1"\n',
     "unknown app.s. bank"),
    ("no-checks.toml", 'id = "x"\nprompt = "p"\napps = ["shop"]\n', "missing key 'checks'"),
    ("two-kinds.toml", 'id = "x"\nprompt = "p"\napps = ["shop"]\n[[checks]]\nname = "c"\nexpect = "1"\n'
                       'answer_includes = "1"\n', r"checks\[0\] = .*: expected one of answer_includes or expect"),
    ("syntax.toml", 'id = "x"\nprompt = "p"\napps = ["shop"]\n[[checks]]\nname = "c"\nexpect = "1 +"\n',
     "check 'c'"),
])
def test_bad_task_files_are_one_line_errors(tmp_path, name, body, message):
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "shop.py").write_text("")
    (tmp_path / "apps.toml").write_text('[shop]\nscript = "apps/shop.py"\nport = 8101\n')
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / name).write_text(body)
    with pytest.raises(TaskError, match=message) as err:
        load_tasks(tmp_path)
    assert "\n" not in str(err.value)


def test_browser_use_adapter_drives_chromium_with_telemetry_off(tmp_path):
    from forgerl.harnesses import HarnessError, McpServer, RunContext, get_harness
    from forgerl.harnesses.browser import CHROMIUM, PLAYWRIGHT_MCP
    from forgerl.harnesses.browser_use import CLI

    harness = get_harness("browser-use")
    ctx = RunContext("find it", tmp_path, tmp_path, "http://127.0.0.1:8787", "s1", "", {},
                     mcp_servers=(PLAYWRIGHT_MCP,))
    argv, env = harness.full_command(harness.find(), ctx)
    assert argv[1:3] == ["-P", str(CLI)] and CLI.name == "browser_use_cli.py" and CLI.exists()
    assert argv[argv.index("--chromium") + 1] == str(CHROMIUM) and argv[argv.index("--model") + 1] == "gpt-5.4"
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8787/s/s1/v1" and env["HOME"] == str(tmp_path)
    assert (env["ANONYMIZED_TELEMETRY"], env["BROWSER_USE_CLOUD_SYNC"], env["BROWSER_USE_VERSION_CHECK"]) == (
        "false", "false", "false")
    assert harness.final_answer('{"result": "SK1840 at $159.00.", "success": true, "steps": 3}\n', ctx) == \
        "SK1840 at $159.00."
    other = RunContext("x", tmp_path, tmp_path, "u", "s1", mcp_servers=(McpServer("calendar", ("cal",)),))
    with pytest.raises(HarnessError, match="browser-use has no MCP client"):
        harness.full_command(harness.find(), other)
