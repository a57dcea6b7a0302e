"""``manage.py sagas_replay_check WORKFLOW``: would this code resume these runs?

Replays the recorded journals of a workflow's runs (every run in flight, plus a sample of the
most recently finished ones) against a version of its code, executing and writing nothing
(``sagas.replay.check``), and says for each run whether the code is compatible with what it
did, where it diverges, or where it raises. Exit status 0 when every run checked is
compatible, 1 when one diverges or errors, 2 for a bad invocation: a deploy pipeline gates on
it before shipping new code::

    manage.py sagas_replay_check order_fulfilment --module orders/workflows_v2.py
    manage.py sagas_replay_check order_fulfilment --code-version 2 --runs-of-version 1 --json
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from core.commands import NoPageCommand
from sagas.errors import InvalidArgument, WorkflowNotRegistered
from sagas.replay.check import COMPATIBLE, definition_for, replay_check, runs_to_check


class Command(NoPageCommand):
    help = "Replay a workflow's runs against a version of its code, executing nothing; exit 1 on divergence."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("workflow", help="the workflow's name")
        parser.add_argument("--code-version", type=int, default=None, dest="code_version",
                            help="the registered version of the code to check against (default: the newest)")
        parser.add_argument("--module", default=None,
                            help="check code not deployed yet: a dotted module name or a .py file that defines it")
        parser.add_argument("--runs-of-version", type=int, default=None, dest="runs_of_version",
                            help="check only the runs of this version (default: every version's)")
        parser.add_argument("--sample", type=int, default=100,
                            help="how many of the most recently finished runs to check too (default 100)")
        parser.add_argument("--run", action="append", default=None, dest="run_ids",
                            help="check exactly this run (repeatable) instead of choosing them")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["sample"] < 0:
            raise CommandError("--sample must be 0 or more")
        try:
            definition = definition_for(options["workflow"], options["code_version"], module=options["module"])
        except (WorkflowNotRegistered, InvalidArgument) as exc:
            raise CommandError(str(exc)) from None
        runs = runs_to_check(options["workflow"], version=options["runs_of_version"], sample=options["sample"],
                             run_ids=options["run_ids"])
        report = replay_check(definition, runs)
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2, default=str))
        else:
            self._print(report)
        if not report.ok:
            raise SystemExit(1)

    def _print(self, report: Any) -> None:
        counts = report.counts
        self.stdout.write(
            f"{report.workflow} v{report.version} ({report.definition_hash[:12]}, {report.module}): "
            f"{len(report.runs)} run(s) checked in {report.seconds:.2f} s: {counts['compatible']} compatible, "
            f"{counts['diverges']} diverge, {counts['error']} error(s)")
        for run in report.runs:
            if run.outcome == COMPATIBLE:
                continue
            where = f" at {run.source['file']}:{run.source['line']}: {run.source['text']}" if run.source else ""
            self.stdout.write(f"  {run.outcome.upper()} run {run.run_id} ({run.status}), seq {run.position}: "
                              f"{run.message}{where}")
