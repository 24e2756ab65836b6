"""What Metaflow's own @parallel tests rely on, on a @torchrun step: each node's
artifacts, cards and @catch result, retry attempt numbering and logs per attempt
(issue 25, item 7; Metaflow's CatchRetryTest, MultipleCardDecoratorTest and
DefaultEditableCardTest). $MFTR_PAR: "retry" (every node raises on attempts 0
and 1, succeeds on 2) or "catch" (every node raises on every attempt; @catch
keeps the run going)."""

import os
import sys

from metaflow import FlowSpec, card, catch, current, retry, step, torchrun
from metaflow.cards import Markdown

CASE = os.environ.get("MFTR_PAR", "retry")


class TestRetry(Exception):
    pass


class ParallelFlow(FlowSpec):
    @step
    def start(self):
        self.next(self.train, num_parallel=2)

    @catch(var="ex", print_exception=False)
    @retry(times=2 if CASE == "retry" else 1, minutes_between_retries=0)
    @card(type="blank")
    @card(type="blank", id="extra")
    @torchrun
    @step
    def train(self):
        node, attempt = current.parallel.node_index, current.retry_count
        current.card.append(Markdown("default card: node %d attempt %d" % (node, attempt)))
        current.card["extra"].append(Markdown("extra card: node %d attempt %d" % (node, attempt)))
        self.node = node
        self.attempt = attempt
        print("stdout: node %d attempt %d" % (node, attempt))
        print("stderr: node %d attempt %d" % (node, attempt), file=sys.stderr)
        if CASE == "catch" or attempt < 2:
            raise TestRetry("node %d attempt %d" % (node, attempt))
        current.torch.run(entrypoint=os.path.join("scripts", "tagged.py"), entrypoint_args=["a%d" % attempt])
        self.next(self.join)

    @step
    def join(self, inputs):
        self.seen = sorted((getattr(i, "node", None), getattr(i, "attempt", None)) for i in inputs)
        self.next(self.end)

    @step
    def end(self):
        pass


if __name__ == "__main__":
    ParallelFlow()
