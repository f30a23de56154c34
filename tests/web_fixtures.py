"""What the web-task tests share: the benchmark's tasks, its apps served on free ports, plain HTTP as an agent's
browser would send it, and grading a task from an app's final state.

`SOLUTIONS` says, per task of `benchmarks/web/`, what an agent that solves it does (the requests its browser
sends, by path) and answers, and what one that fails does: the graders must score the first 1.0 and the
second below it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from forgerl.recorder.proxy import free_port
from forgerl.runners.grading import GradeInput
from forgerl.runners.kinds.web import HEALTH_PATH, STATE_PATH, WebApp, WebTask, load_apps

from conftest import REPO

WEB_BENCH = REPO / "benchmarks" / "web"


@contextmanager
def served(app: WebApp) -> Iterator[str]:
    """`app` served on a free loopback port (outside a sandbox its fixed port may be taken): its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(app.script), "--port", str(port)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url + HEALTH_PATH, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait()


def http(url: str, form: dict[str, str] | None = None) -> tuple[int, str]:
    """GET `url`, or POST `form` to it, following redirects: (status, body)."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with urllib.request.urlopen(url, data=data, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def app_state(url: str) -> dict:
    return json.loads(http(url + STATE_PATH)[1])


def grade_states(task: WebTask, states: dict[str, dict], answer: str | None, workspace: Path,
                 actions_from: list[list] | None = None) -> dict[str, float]:
    """`task.score` for apps left in `states` ({app: state}, as the sandbox collects them) and the final answer
    `answer` (no recorded trajectory)."""
    run = GradeInput(workspace, "no-session", workspace, answer, {k: {STATE_PATH: v} for k, v in states.items()})
    run.__dict__["turns"] = actions_from or []  # each model call's answer, as a recording gives them; none here
    return task.score(run)


# task id -> (solving steps, solving answer, failing steps, failing answer); a step is a path, or (path, form)
SHOP_ORDER = {"name": "Ada Lovelace", "address": "12 Analytical Street", "city": "London", "zip": "10001",
              "shipping": "standard"}
SOLUTIONS: dict[str, tuple[list, str, list, str]] = {
    "shop-cheapest-kettle": (["/search?q=kettle&in_stock=1&sort=price_asc"],
                             "The Classic Stovetop Kettle, at $39.95.",
                             ["/search?q=kettle&sort=price_asc"], "The Compact Travel Kettle, at $27.50."),
    "shop-top-rated-tea": (["/search?category=tea&sort=rating"], "Gyokuro Shade, rated 4.8 out of 5.",
                           ["/search?category=tea"], "Silver Needle, rated 4.7."),
    "shop-past-order-total": (["/orders", "/orders/1002"], "Order #1002 came to $68.05; the kettle was the "
                              "Classic Stovetop Kettle.", ["/orders"], "It came to $23.80."),
    "shop-buy-sencha": (["/product/TEA-01", ("/cart/add", {"sku": "TEA-01", "qty": "2"}),
                         ("/checkout", SHOP_ORDER)], "Order placed.",
                        ["/product/TEA-01", ("/cart/add", {"sku": "TEA-01", "qty": "1"}),
                         ("/checkout", SHOP_ORDER)], "Order placed."),
    "shop-cart-cheapest-mug": ([("/cart/add", {"sku": "MUG-01", "qty": "1"})], "Added.",
                               [("/cart/add", {"sku": "MUG-02", "qty": "1"})], "Added."),
    "shop-express-grinder": ([("/cart/add", {"sku": "ACC-03", "qty": "1"}),
                              ("/cart/add", {"sku": "ACC-02", "qty": "1"}),
                              ("/checkout", {"name": "Grace Hopper", "address": "7 Cobol Lane", "city": "Arlington",
                                             "zip": "22201", "shipping": "express"})],
                             "Order #1003, total $63.70.",
                             [("/cart/add", {"sku": "ACC-03", "qty": "1"}),
                              ("/checkout", {"name": "Grace Hopper", "address": "7 Cobol Lane", "city": "Arlington",
                                             "zip": "2220", "shipping": "express"})], "The ZIP code was refused."),
    "travel-cheapest-flight": (["/flights?origin=LIS&destination=OSL&date=2026-12-20&passengers=1"],
                               "SK1840 at $159.00.",
                               ["/flights?origin=LIS&destination=OSL&date=2026-12-20&passengers=1"], "TP614 at $164."),
    "travel-trip-departure": (["/trips/RB4M9T"], "It departs at 17:50; the booking cost $810.00.",
                              ["/trips"], "It departs at 08:30."),
    "travel-book-flight": ([("/book/FR2201", {"date": "2026-12-22", "passengers": "1", "first_name": "Alan",
                                              "last_name": "Turing", "email": "alan@turing.org", "cabin": "economy"})],
                           "Booked: reference 4UWEF5.",
                           [("/book/IB3671", {"date": "2026-12-22", "passengers": "1", "first_name": "Alan",
                                              "last_name": "Turing", "email": "alan@turing.org", "cabin": "economy"})],
                           "Booked."),
    "travel-cancel-trip": ([("/trips/KX7P2Q/cancel", {})], "Cancelled.",
                           [("/trips/RB4M9T/cancel", {})], "Cancelled."),
    "travel-business-two": ([("/book/AZ61", {"date": "2026-12-16", "passengers": "2", "first_name": "Katherine",
                                             "last_name": "Johnson", "email": "katherine@nasa.example.com",
                                             "cabin": "business"})], "Booked.",
                            [("/book/AZ61", {"date": "2026-12-16", "passengers": "2", "first_name": "Katherine",
                                             "last_name": "Johnson", "email": "katherine@nasa",
                                             "cabin": "business"})], "Booked."),
    "travel-date-validation": (["/flights?origin=ROM&destination=BER&date=2026-11-28",
                                "/flights?origin=ROM&destination=BER&date=2026-12-15"],
                               "The date must not be before today, 2026-12-01. On 2026-12-15: LH231 and FR3301.",
                               ["/flights?origin=ROM&destination=BER&date=2026-12-15"], "LH231 and FR3301."),
}


def act(url: str, steps: list) -> None:
    for step in steps:
        path, form = (step, None) if isinstance(step, str) else step
        http(url + path, form)


def run_solution(task: WebTask, steps: list, answer: str, workspace: Path) -> dict[str, float]:
    """Serve the task's apps afresh, send `steps` to its (one) app, grade `answer` against the state left."""
    (app,) = task.apps
    with served(app) as url:
        act(url, steps)
        return grade_states(task, {app.name: app_state(url)}, answer, workspace)


def load_app(name: str) -> WebApp:
    return load_apps(WEB_BENCH)[name]


def with_checks(task: WebTask, *checks: dict) -> WebTask:
    return replace(task, checks=checks)
