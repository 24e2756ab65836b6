"""Failure types users see.

Every error a user can hit is a ``MetaflowException`` so Metaflow prints it as a
clean one-paragraph message instead of a traceback from inside the launcher.
"""

from __future__ import annotations

from typing import List, Optional

from metaflow.exception import MetaflowException

from .failures import RankFailure, describe_exit_code, root_cause_order


class TorchrunException(MetaflowException):
    headline = "@torchrun error"


class TorchrunInvalidArgument(TorchrunException):
    """A value given to ``@torchrun`` or ``current.torch.run`` cannot be used."""

    headline = "@torchrun: invalid argument"


class TorchrunFailed(TorchrunException):
    """torchrun on this node ended unsuccessfully."""

    headline = "@torchrun job failed"

    def __init__(
        self,
        exit_code: int,
        node_index: int,
        failures: Optional[List[RankFailure]] = None,
        command: Optional[List[str]] = None,
    ):
        self.exit_code = exit_code
        self.node_index = node_index
        self.failures = root_cause_order(list(failures or []))
        self.root_cause = self.failures[0] if self.failures else None
        self.command = command
        lines = [
            "torchrun on node %d ended with %s."
            % (node_index, describe_exit_code(exit_code))
        ]
        if self.root_cause is not None:
            lines.append("First failure: %s" % self.root_cause.summary())
            if self.root_cause.traceback:
                lines.append(self.root_cause.traceback.rstrip())
            others = self.failures[1:]
            if others:
                lines.append(
                    "Also failed: %s"
                    % ", ".join("rank %d" % f.rank for f in others)
                )
        else:
            lines.append(
                "No rank recorded a Python exception (a rank may have been killed by a "
                "signal, or torchrun itself failed); see the log above."
            )
        super().__init__("\n".join(lines))


class GangAborted(TorchrunException):
    """This node stopped its torchrun because the gang failed elsewhere (or a node
    went silent, or never joined)."""

    headline = "@torchrun gang stopped"

    def __init__(self, node_index: int, cause: dict, own_exit_code: Optional[int] = None):
        self.node_index = node_index
        self.cause = dict(cause or {})
        summary = self.cause.get("summary") or self.cause.get("kind") or "unknown cause"
        origin = self.cause.get("node_index")
        if origin is not None and origin != node_index and self.cause.get("kind") == "failed":
            text = "node %d stopped its torchrun because node %d failed first: %s" % (
                node_index, origin, summary)
            text += "\n(The failing rank's traceback is in node %d's log.)" % origin
        else:
            text = "node %d stopped its torchrun: %s" % (node_index, summary)
        super().__init__(text)


class TorchrunInterrupted(TorchrunException):
    """The step was asked to stop (SIGTERM) while torchrun was running."""

    headline = "@torchrun interrupted"
