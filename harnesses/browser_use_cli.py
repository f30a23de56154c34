"""browser-use as a headless command line: one task, one agent run, the final answer as JSON on stdout.

browser-use is a library, not a CLI (its `browser-use` command drives a
browser by hand), so this script is the harness's command line: run by
`.venv-browser/bin/python` (browser-use's own pinned venv), it imports
browser-use alone, never forgerl. The agent drives the Chromium binary at
`--chromium` over CDP (headless, its own temporary profile, no extensions
downloaded), with vision on (a screenshot in every step's message), and
speaks Chat Completions through browser-use's `ChatOpenAI` to
`OPENAI_BASE_URL` (the recorder's session) with `OPENAI_API_KEY`.
Telemetry, cloud sync and version checks are off through the environment
its harness spec sets (`browser_use.py` `BROWSER_USE_OFFLINE`); its judge (a
second model call grading the run after `done`) is off: the task's grader
grades.

    python browser_use_cli.py --task TEXT --model M --history FILE [--chromium PATH] [--max-steps N]
                              [--viewport WxH]

Prints `{"result": <the agent's final answer or null>, "success": ..., "steps": N}`;
`--history` gets browser-use's own record of the run (its transcript).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os


async def run(args: argparse.Namespace) -> dict:
    from browser_use import Agent, BrowserProfile, BrowserSession, ChatOpenAI

    width, height = (int(n) for n in args.viewport.split("x"))
    profile = BrowserProfile(executable_path=args.chromium, headless=True, chromium_sandbox=False,
                             enable_default_extensions=False, user_data_dir=None,
                             viewport={"width": width, "height": height},
                             window_size={"width": width, "height": height},
                             args=["--disable-dev-shm-usage", "--no-first-run"])
    llm = ChatOpenAI(model=args.model, base_url=os.environ["OPENAI_BASE_URL"],
                     api_key=os.environ.get("OPENAI_API_KEY", "sk-forgerl-placeholder"))
    agent = Agent(task=args.task, llm=llm, browser_session=BrowserSession(browser_profile=profile), use_vision=True,
                  use_judge=False, generate_gif=False, calculate_cost=False)
    history = await agent.run(max_steps=args.max_steps)
    history.save_to_file(args.history)
    return {"result": history.final_result(), "success": history.is_successful(), "steps": history.number_of_steps()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--viewport", default="1280x800", help="WIDTH x HEIGHT of the page (and its screenshots)")
    print(json.dumps(asyncio.run(run(parser.parse_args()))), flush=True)


if __name__ == "__main__":
    main()
