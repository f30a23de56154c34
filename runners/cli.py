"""`forge-run`: run tasks x attempts with a harness pointed at the recorder, grade them, keep the outcomes.

    forge-run TASKS --harness NAME --upstream URL --attempts K --parallel N --out DATASET
              [--runner local|kubernetes] [--watch [--policy-version-from FILE|URL]]

TASKS is a task file (QwenClawBench task_*.md or a forgerl *.toml spec), a
folder of them, a benchmark folder (tasks/ + assets/), or a task kind's
layout (runners/kinds/: ClawEval, Harbor, web tasks). The harness CLI is
taken from PATH, else from the project's pinned installs (node_modules/.bin
on Node 24, .venv-mini/bin; browser-use from .venv-browser);
runners/README.md#harnesses says how each is
configured. --upstream is what it is for `forge-record serve`: the
origin the recorder forwards to (http://HOST:PORT, no /v1; request paths
pass through unchanged), speaking the harness's own API. --policy URL instead
answers the harness from a policy server (vLLM protocol, token in / token out)
through `forge-record serve --policy` (serve mode, token ids recorded),
sampling at --temperature and --top-p (0: greedy, for evaluation), at
most --max-tokens a turn. A
recorder (`forge-record serve`, a process of its own) is started on a free
loopback port for the run, or given with --recorder-url (a `forge-record
serve` the pods can reach, e.g. deploy/recorder.yaml).

A Harbor task directory (task.toml, instruction.md, environment/,
tests/test.sh), or a folder of them, runs the agent and then tests/test.sh
in the same jail with the verifier's own timeout; the reward is what it
writes to /logs/verifier/reward.txt or reward.json, and the agent cannot
write it first. Services a task.toml declares ([[forgerl.services]], which
Harbor ignores) start before the agent and stay up through the verifier,
while every process the agent left is gone. The local runner builds no image: it runs on this machine's
tools (outcomes say environment: host and list the Dockerfile steps not
honoured) with /app, /tests and /logs/verifier of each rollout's own (mount
namespace); Kubernetes pods run in the task's image
(runners/README.md#harbor-tasks).

A web benchmark (a folder with apps.toml and tasks/*.toml, like
benchmarks/web) serves each task's web apps inside the rollout's own
network namespace on their fixed ports and grades the final answer, the
apps' final state and the trajectory (runners/kinds/web.py). Its browser:
--harness browser-use runs browser-use (.venv-browser, make test) driving
the Debian Chromium (/usr/bin/chromium) over CDP, headless, a screenshot in
every step, through Chat Completions at the recorder, its telemetry off;
--harness claude-code (or any harness with an MCP client) gets the task's
MCP server `playwright`: @playwright/mcp (package.json) on the same
Chromium, headless, --caps vision, so browser_take_screenshot answers with
an image tool result.

Finished rollouts (same task, attempt, harness and policy version) are
skipped, so an interrupted run resumes. The final tables give pass@k /
pass^k per task, then the per-task pass rates (solved never, sometimes,
always). --watch keeps going: whenever the endpoint's policy version changes
(its /v1/models root or id, or --policy-version-from), it runs the tasks
again with every call and outcome tagged with that version. Without
--watch, one round is tagged with --policy-version V, else with what
--policy-version-from or the --policy server says, else not at all.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from tqdm import tqdm

from forgerl import printer
from forgerl.analysis.pass_rates import rates_table
from forgerl.cli import run_verb
from forgerl.errors import UserError
from forgerl.harnesses import HARNESSES, get_harness, mcp_help, resume_help
from forgerl.recorder.credentials import new_secret, secret_from_env
from forgerl.recorder.otlp import add_otlp_flag, configure_export
from forgerl.recorder.redact import Redactor
from forgerl.schema.storage import local_only
from forgerl.schema.writer import DatasetWriter

from . import outcomes
from .grading import Judge
from .policy import PolicyVersionError, PolicyVersionSource
from .rollout import KEY_SHAPES, Rollout
from .serve import policy_recorder, upstream_recorder
from .simulated_user import UserModel, refusal
from .loader import load_tasks
from .tasks import Task


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return int(value)


def _tools_help() -> str:
    """The --help epilog: how ClawEval tasks run, and how each harness is given their tools over MCP."""
    return ("ClawEval (a folder with tasks/*/task.yaml beside mock_services/, one task folder, or a task.yaml): each\n"
            "rollout starts the task's mock services in its own network namespace (so their fixed ports never\n"
            "clash), and the harness gets the task's tools from an MCP server named `claweval` (python -m\n"
            "forgerl.runners.kinds.claweval_mcp TASK_YAML) that calls the services. The task's own grader.py\n"
            "scores the recorded conversation and the services' audit logs; a trial passes at task score >=\n"
            "0.75. Those needing the live web are infra_error.\n"
            "Tasks with a simulated user (user_agent persona) need --user-model: ClawEval's own UserAgent answers\n"
            "each final answer of the harness, and its reply (unless [DONE], or max_rounds replies were sent) goes\n"
            "to the same harness session as the next user turn, prefixed [user_agent]; the grader reads the whole\n"
            "dialogue, outcomes.extra.user_agent says rounds_used, max_rounds, done_reached. Without --user-model\n"
            "they are skipped. How each harness resumes its session:\n" + resume_help() +
            "\nMCP servers per harness:\n" + mcp_help())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="forge-run", description=__doc__, epilog=_tools_help(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tasks", metavar="TASKS", help="task file, folder of task files, or benchmark folder")
    p.add_argument("--harness", required=True, choices=sorted(HARNESSES),
                   help="harness CLI to run (found from $FORGE_<TOOL>, PATH, the tools config file "
                        "($FORGE_CONFIG or ~/.config/forgerl/tools.toml), else the project's pinned installs; each "
                        "configured as runners/README.md#harnesses says)")
    p.add_argument("--upstream", default="", help="origin the recorder forwards to, http://HOST:PORT (no /v1)")
    p.add_argument("--policy", default="", metavar="URL",
                   help="instead of --upstream: answer the harness from this policy server (vLLM protocol) "
                   "through `forge-record serve --policy`; needs --tokenizer and --served-model")
    p.add_argument("--tokenizer", default="", metavar="DIR", help="with --policy: the policy's tokenizer directory")
    p.add_argument("--served-model", default="", metavar="NAME", help="with --policy: the served model name")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="with --policy: sampling temperature (default 1.0; 0 is greedy, for evaluation)")
    p.add_argument("--top-p", type=float, default=1.0, help="with --policy: nucleus sampling (default 1.0)")
    p.add_argument("--max-tokens", type=int, default=1024, metavar="N",
                   help="with --policy: the gateway's cap on tokens a turn (default 1024)")
    p.add_argument("--attempts", type=_positive, default=1, metavar="K", help="attempts per task (default 1)")
    p.add_argument("--parallel", type=_positive, default=1, metavar="N",
                   help="harnesses running at once (default 1); a finished rollout is graded beside the next")
    p.add_argument("--out", required=True, metavar="DATASET", help="dataset root: calls and outcomes land here")
    p.add_argument("--runner", choices=("local", "kubernetes"), default="local")
    p.add_argument("--model", default="", help="model name passed to the harness (default: its spec's "
                                                "default_model; codex: gpt-5.4, with which it sends its tool "
                                                "definitions)")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="override every task's timeout")
    p.add_argument("--retries", type=int, default=2, help="retries of an infra failure (default 2)")
    p.add_argument("--task", action="append", default=[], metavar="ID", help="only these task ids (repeatable)")
    p.add_argument("--judge", default="", metavar="URL", help="an OpenAI-compatible API base for the LLM-judged "
                   "parts of ClawEval graders (key from FORGE_JUDGE_API_KEY or OPENAI_API_KEY; on Kubernetes "
                   "the pod's model-keys sidecar's, from the template's Secret); without it they score 0 and outcomes say "
                   "'not graded'")
    p.add_argument("--judge-model", default="", metavar="M", help="with --judge: the judge's model name")
    p.add_argument("--user-model", default="", metavar="URL", help="an OpenAI-compatible API base for the "
                   "simulated user of tasks with a persona (ClawEval user_agent; key from FORGE_USER_MODEL_API_KEY or "
                   "OPENAI_API_KEY; on Kubernetes the pod's model-keys sidecar's, from the template's Secret); without it those "
                   "tasks are skipped")
    p.add_argument("--user-model-name", default="", metavar="M", help="with --user-model: its model name")
    p.add_argument("--no-network-isolation", action="store_true",
                   help="local runner: do not put harnesses in a network namespace")
    p.add_argument("--allow-weak-jail", "--allow-shared-proc", dest="allow_weak_jail", action="store_true",
                   help="local runner: run even where the harnesses would share forgerl's /proc (no PID namespace: "
                   "--no-network-isolation, or no unshare here) or run as forgerl's own uid (no uid switch here), so "
                   "an agent could read the keys in forgerl's processes' environments and every file forgerl may")
    p.add_argument("--redact-rules", default="", metavar="FILE",
                   help="extra redaction regexes, one per line, for the recorder forge-run starts and for what "
                   "outcomes keep of the harness's own words (its stderr, own transcript, final answer); keys, "
                   "tokens and .env secrets are always redacted. A recorder given with --recorder-url keeps its own")
    p.add_argument("--recorder-url", default="", help="use this running recorder instead of starting one "
                   "(required for --runner kubernetes unless pods can reach this machine)")
    add_otlp_flag(p)
    p.add_argument("--pass-keys", action="store_true",
                   help="give each harness the real model-API key (the recorder passes it through) instead of a "
                   "token for its own session, revoked once the rollout is graded (the default: only the recorder "
                   "holds the keys; with --recorder-url, that recorder's secret comes from $FORGE_RECORDER_SECRET)")
    p.add_argument("--watch", action="store_true", help="re-run whenever the policy version changes")
    p.add_argument("--policy-version", default="", metavar="V",
                   help="tag this round's calls and outcomes with V (not with --watch)")
    p.add_argument("--policy-version-from", default="", metavar="FILE|URL",
                   help="read the policy version here instead of the upstream's /v1/models")
    p.add_argument("--watch-interval", type=float, default=30.0, metavar="S", help="seconds between version checks")
    p.add_argument("--rounds", type=int, default=0, help="with --watch: stop after this many versions (0: never)")
    k8s = p.add_argument_group("kubernetes runner")
    k8s.add_argument("--kube-api", default="", metavar="URL", help="API server URL (default: kubeconfig / in-cluster)")
    k8s.add_argument("--kubeconfig", default="")
    k8s.add_argument("--namespace", default="forgerl")
    k8s.add_argument("--image", default="", help="rollout image (default: the template's)")
    k8s.add_argument("--image-registry", default="", metavar="REG",
                     help="Harbor tasks without docker_image run in REG/harbor-<task>:<hash of environment/>, "
                          "built and pushed beforehand (runners/README.md#harbor-tasks)")
    k8s.add_argument("--pod-template", default="", metavar="YAML",
                     help="default: runners/pod-template.yaml, shipped in the package")
    k8s.add_argument("--pod-tasks", default="/tasks", help="TASKS as mounted in the pods")
    k8s.add_argument("--pod-dataset", default="/data", help="the dataset root as mounted in the pods")
    return p


def _select(tasks: list[Task], ids: list[str]) -> list[Task]:
    if not ids:
        return tasks
    known = {t.id for t in tasks}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise UserError(f"no such task: {', '.join(unknown)}")
    return [t for t in tasks if t.id in ids]


def _runnable(tasks: list[Task], persona_refusal: str) -> list[Task]:
    """The tasks without a reason to skip them (tasks with a persona: `persona_refusal`); each skipped one is said
    on stderr."""
    kept = []
    for task in tasks:
        skip = task.skip or (persona_refusal if task.persona else "")
        if skip:
            print(f"forge-run: skipping {task.id}: {skip}", file=sys.stderr)
        else:
            kept.append(task)
    if not kept:
        raise UserError("every selected task is skipped (see above)")
    return kept


def _model(args: argparse.Namespace) -> str:
    """The model each rollout asks for, as its outcome records it."""
    return get_harness(args.harness).model_for(args.model)


def _runner(args: argparse.Namespace, recorder_url: str, recorder_secret: str = ""):
    harness = get_harness(args.harness)
    model = _model(args)
    if args.runner == "local":
        from .local import LocalRunner
        return LocalRunner(harness, recorder_url, Path(args.out), parallel=args.parallel, retries=args.retries,
                           isolate_network=not args.no_network_isolation, model=model, timeout_s=args.timeout,
                           judge=Judge(args.judge, args.judge_model) if args.judge else None,
                           user=_user_model(args), recorder_secret=recorder_secret)
    from .kubernetes import KubernetesRunner, api_client, load_template
    template = load_template(Path(args.pod_template)) if args.pod_template else load_template()
    return KubernetesRunner(harness, recorder_url, api_client(args.kube_api, args.kubeconfig),
                            namespace=args.namespace, template=template, image=args.image,
                            pod_tasks=args.pod_tasks, pod_dataset=args.pod_dataset, parallel=args.parallel,
                            image_registry=args.image_registry,
                            retries=args.retries, model=model, timeout_s=args.timeout,
                            judge=Judge(args.judge, args.judge_model) if args.judge else None,
                            user=_user_model(args), recorder_secret=recorder_secret)


def _user_model(args: argparse.Namespace) -> UserModel | None:
    return UserModel(args.user_model, args.user_model_name) if args.user_model else None


def run_round(args: argparse.Namespace, tasks: list[Task], policy_version: str) -> int:
    """One pass over tasks x attempts for one policy version; prints the pass@k table."""
    out, model = Path(args.out), _model(args)
    done = outcomes.finished(out, args.harness, model, policy_version) if (out / "forgerl.json").exists() else set()
    todo = [Rollout(t, a, policy_version) for t in tasks for a in range(args.attempts) if (t.id, a) not in done]
    skipped = len(tasks) * args.attempts - len(todo)
    label = f" (policy {policy_version})" if policy_version else ""
    with ExitStack() as stack:
        recorder_url = args.recorder_url
        secret = args.recorder_secret or ("" if args.pass_keys else new_secret())  # a fresh one per recorder
        if todo and not recorder_url and args.policy:
            recorder_url = stack.enter_context(policy_recorder(out, args.policy, args.tokenizer, args.served_model,
                                                               policy_version, args.redact_rules, secret,
                                                               (args.temperature, args.top_p, args.max_tokens)))
        if todo and not recorder_url:
            recorder_url = stack.enter_context(upstream_recorder(out, args.upstream, policy_version,
                                                                 args.redact_rules, secret))
            if args.runner == "kubernetes":
                print(f"forge-run: no --recorder-url: pods must reach {recorder_url} (this machine's loopback)",
                      file=sys.stderr)
        print(f"forge-run: {len(todo)} rollouts to run, {skipped} already finished{label}", file=sys.stderr)
        if todo:
            runner = _runner(args, recorder_url, secret)
            runner.redactor = args.redactor
            writer = stack.enter_context(DatasetWriter(out, source="runner"))
            bar = stack.enter_context(tqdm(total=len(todo), desc="rollouts", unit="rollout", file=sys.stderr))

            def done_one(outcome) -> None:
                bar.set_postfix_str(f"{outcome.rollout.task.id[:30]} {outcome.status}")
                bar.update()

            runner.run(todo, writer, on_done=done_one)
    ids = {t.id for t in tasks}
    rows = [r for r in outcomes.outcome_rows(out, args.harness, model, policy_version) if r["task_id"] in ids]
    table = outcomes.pass_table(rows, args.attempts, {t.id: t for t in tasks})
    printer.show(outcomes.pass_at_k_table(table, args.attempts, outcomes.pass_rules(tasks)))
    printer.show(rates_table(outcomes.rate_rows(table, args.harness, policy_version),
                             f"pass rates per task (policy {policy_version or '(none)'})"))
    return 0


def watch(args: argparse.Namespace, tasks: list[Task]) -> int:
    served = args.policy if args.policy.startswith(("http://", "https://")) else ""
    source = PolicyVersionSource(args.upstream or served, args.policy_version_from)
    seen: list[str] = []
    while not args.rounds or len(seen) < args.rounds:
        try:
            version = source.current()
        except PolicyVersionError as e:
            print(f"forge-run: {e}; retrying in {args.watch_interval:.0f} s", file=sys.stderr)
            version = seen[-1] if seen else ""
        if version and (not seen or version != seen[-1]):
            seen.append(version)
            print(f"forge-run: policy version {version}", file=sys.stderr)
            run_round(args, tasks, version)
            continue
        time.sleep(args.watch_interval)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_verb("forge-run", lambda: _run(args))


def _check_jail(args: argparse.Namespace) -> None:
    """Refuse (or, with --allow-weak-jail, warn) where a local harness could read forgerl's keys or root's files."""
    from .sandbox import weak_jail_reason

    why = weak_jail_reason(not args.no_network_isolation)
    if why and not args.allow_weak_jail:
        raise UserError(f"harnesses could read forgerl's keys and files ({why}); pass --allow-weak-jail to accept that")
    if why:
        print(f"forge-run: warning: harnesses could read forgerl's keys and files ({why})", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    """Check the flag combinations, then run one round or watch the policy version."""
    if sum(map(bool, (args.upstream, args.policy, args.recorder_url))) != 1:
        raise UserError("give one of --upstream URL (the model API origin), --policy URL or --recorder-url URL")
    if args.policy and not (args.tokenizer and args.served_model):
        raise UserError("--policy needs --tokenizer DIR and --served-model NAME")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise UserError(f"--temperature must be >= 0 and --top-p in (0, 1], got {args.temperature} and {args.top_p}")
    if args.max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.upstream and not args.upstream.startswith(("http://", "https://")):
        raise UserError(f"--upstream must be http(s)://HOST[:PORT], got {args.upstream!r}")
    local_only(args.out, "forge-run --out")  # its graders and resume check read the dataset as local files
    if args.watch and not (args.upstream or args.policy.startswith("http") or args.policy_version_from):
        raise UserError("--watch needs --upstream or --policy (their /v1/models) or --policy-version-from")
    if args.watch and args.policy_version:
        raise UserError("--policy-version tags one round; --watch reads each round's version from the policy")
    if args.otlp and args.recorder_url:
        raise UserError("--otlp exports from the recorder forge-run starts; give it to the --recorder-url recorder")
    configure_export(args, outcomes=True)  # the runner ends each session's trace with its outcome
    if bool(args.judge) != bool(args.judge_model):
        raise UserError("--judge URL and --judge-model M go together")
    if bool(args.user_model) != bool(args.user_model_name):
        raise UserError("--user-model URL and --user-model-name M go together")
    if args.runner == "local":
        _check_jail(args)
    args.recorder_secret = secret_from_env() if args.recorder_url and not args.pass_keys else ""
    args.redactor = Redactor.from_file(args.redact_rules) if args.redact_rules else KEY_SHAPES
    persona_refusal = refusal(_user_model(args), get_harness(args.harness))
    tasks = _runnable(_select(load_tasks(args.tasks), args.task), persona_refusal)
    get_harness(args.harness).find()
    return watch(args, tasks) if args.watch else run_round(args, tasks, _round_version(args))


def _round_version(args: argparse.Namespace) -> str:
    """One round's tag: --policy-version, else what --policy-version-from or the served policy says now, else none
    (a vendor API behind --upstream has no version of its own)."""
    if args.policy_version:
        return args.policy_version
    served = args.policy if args.policy.startswith(("http://", "https://")) else ""
    if args.policy_version_from or served:
        return PolicyVersionSource(served, args.policy_version_from).current()
    return ""


if __name__ == "__main__":
    sys.exit(main())
