"""The world the engine runs (runtime.simulation.world and the sub-domains' classes built on
it), with the actions aimed where the risk is that cross sub-domains: a claim, its call and its
report in one step, and what follows an answer lost after the receiver acted."""

from __future__ import annotations

import re

from runtime.models import CheckResult, Event, Operation, Signal, Task
from runtime.rules.statuses import OperationStatus
from runtime.simulation.catalog import HOSTILE_STEPS, Held
from runtime.simulation.facts import contract
from runtime.simulation.people import People
from runtime.simulation.schedule import Step

S = OperationStatus


class World(People):
    def do_work(self, step: Step) -> str:
        """A worker claims due work and calls its receiver at once, and half the time reports
        at once too (the common case in one step, so more of the run is spent on what follows:
        the other half waits for its report, where stops, expiries and takeovers meet it)."""
        op_id = self._claimable(step.a)
        if op_id is None:
            return "nothing"
        held, note = self._claim(op_id, step.b % len(self.workers), step)
        if held is None:
            return note
        note += "; " + self._call(held, step.b // 3)
        if step.b % 2:
            return note
        self.held.remove(held)
        note += "; " + self._report(held)
        return note + self._after_lost_answer(held, step)

    def do_report(self, step: Step) -> str:
        ready = [h for h in self.held if h.report is not None]
        held = self._pick(ready, step.a)
        if held is None:
            return "nothing"
        if self._batched(held):
            return self._report_batch(held, step)
        note = self._report(held) + self._after_lost_answer(held, step)
        if step.fault == "lost" and note.startswith("accepted"):
            held.reported = True  # the worker did not see it and reports again later
            return note + " (lost response)"
        self.held.remove(held)
        return note

    def _after_lost_answer(self, held: Held, step: Step) -> str:
        """Aimed at a call whose receiver acted but whose answer was lost, once its "unknown"
        report was accepted and the work waits for its retry, chosen by the step's numbers: a
        repeat of that very call once its retry is due (the lookup or replay must find what the
        receiver holds), or an ending of its task decided while the outcome is still unknown
        (it must go to a person)."""
        op_id, generation = held.lease.operation_id, held.lease.lease_generation
        call = self.facts.calls.get((op_id, generation))
        if call is None or not call.reached or call.outcome != "unknown":
            return ""
        op = Operation.objects.filter(pk=op_id, status=S.RETRY_SCHEDULED).first()
        if op is None or contract(op.tool) == "pure":  # nothing to fear from a pure tool
            return ""
        if (step.a // 11) % 2 == 0:
            note = self._to(op.next_attempt_at) if op.next_attempt_at else "due"
            again, claimed = self._claim(op_id, (held.worker + 1) % len(self.workers), step)
            note += "; " + claimed
            if again is not None:
                note += "; " + self._call(again, step.a)
            return "; repeat: " + note
        how = ("cancel", "fail", "complete")[(step.b // 7) % 3]
        if how == "complete":
            return "; then " + self._complete(op.task_id, "end_unresolved")
        return "; then " + self._stop(how, step.b // 21, op.task_id)

    def coverage(self) -> dict[str, int]:
        """What the run got to exercise (printed by the command; the tests require some)."""
        text = "\n".join(self.trace)
        ops = self._ops()
        return {
            "claims": len(re.findall(r"claimed \S+ g\d+ by", text)),
            "acceptances": len(re.findall(r"accepted \S+ -> ", text)),
            "batch reports": len(re.findall(r"batch accepted [1-9]", text)),
            "agent reports": len(re.findall(r"agent reported \S+ -> ", text)),
            "takeovers": text.count("takeover of"),
            "late reports": text.count("late "),
            "stops of live work": len(
                re.findall(r"^\d+ stop_live (cancel|fail|pause) ", text, re.M)
            ),
            "artifacts accepted": text.count("accepted artifact") + text.count("delivered "),
            "checks passed": CheckResult.objects.filter(result="passed").count(),
            "tasks succeeded with checks": Task.objects.filter(
                outcome="succeeded", required_checks__isnull=False
            )
            .distinct()
            .count(),
            "compensations": ops.filter(compensates__isnull=False).count(),
            "unresolved": ops.filter(status=S.UNRESOLVED).count(),
            "resolved by a person": sum(len(v) for v in self.facts.resolved.values()),
            "signals delivered": Signal.objects.filter(consumed_at__isnull=False).count(),
            "signals late or duplicate": Signal.objects.filter(disposition=Signal.LATE).count()
            + text.count("duplicate"),
            "timers fired": Event.objects.filter(type="timer.fired").count(),
            "hostile steps": ops.filter(step__in=HOSTILE_STEPS).count(),
        }
