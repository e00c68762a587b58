"""What both handles hold: their place in a process group, the exchange among its ranks, the
rejoin after ranks died, the log-density sum and ``close``.

A handle's data sit on the ranks of one group (:mod:`~mixle_nb.parallel.group`). Every operation
that crosses ranks goes through one :class:`~mixle_nb.parallel.exchange.RankExchange` and carries
its status word in the exchange it makes anyway, so a rank that fails makes every rank raise
together, through the one failure path :meth:`~mixle_nb.parallel.exchange.RankExchange.settle`.
The EM handle and the token handle differ in what they hold, how they read it again and how they
score it; :class:`GroupHandle` is the rest.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..stats.handle import HandleLifetime
from .exchange import STATUS, Header, RankExchange, StatusCheck
from .fold import SAME_MODEL
from .group import GROUP_TIMEOUT_S, GroupMembership, join_group, require_every_rank

LOG_DENSITY_HEADER = Header(**STATUS, count=1, total=1)  # the log-density sum's one exchange


class GroupHandle(HandleLifetime):
    """The skeleton of a handle whose data are spread over the ranks of one process group.

    Subclasses set :attr:`handle_name` (named in errors) and fill in the hooks: what they
    drop on :meth:`close` (:meth:`_drop_resident`), what :meth:`rejoin` checks and reads again
    (:meth:`_check_rejoin`, :meth:`_read_again`), and how a rank scores its own data under a
    model (:meth:`_local_log_density`, optionally :meth:`_model_text` and
    :meth:`explain_failure`)."""

    handle_name: ClassVar[str] = "handle"
    _membership: GroupMembership
    exchange: RankExchange
    rank: int
    world: int
    root: int

    def _join_group(
        self,
        group: Any,
        *,
        init_process_group: bool = True,
        backend: str | None = None,
        timeout: float = GROUP_TIMEOUT_S,
    ) -> None:
        """Adopt or create the group (:func:`~mixle_nb.parallel.group.join_group`), refuse a call
        sent to only some of its ranks, and take this rank's place in it."""
        self._membership = join_group(group, init_process_group=init_process_group, backend=backend, timeout=timeout)
        require_every_rank(self._membership, f"building a {self.handle_name}")
        self.rank, self.world = self._membership.rank, self._membership.world

    def _connect(self, root: int = 0) -> None:
        """The exchange among the group's ranks, ``root`` the rank that gathers and broadcasts."""
        self.root = root
        self.exchange = RankExchange(self._membership, root, self._sent)

    def _sent(self, phase: str | None) -> None:
        """Told once this rank's part of an exchange is on its way (fault-injection hook)."""

    @property
    def membership(self) -> GroupMembership:
        """This rank's place in the handle's group."""
        return self._membership

    # -- rejoin ------------------------------------------------------------------------------

    def rejoin(self) -> list:
        """Go on after ranks died: every survivor calls it together, once the survivors formed
        a new default group (a MixleCluster's elastic recovery does both). Takes this rank's new
        rank and world, then reads again what the lost ranks held.

        Returns
        -------
        list
            What this rank read again (the subclass says what).

        Raises
        ------
        RuntimeError, ValueError
            The handle cannot go on after a rank died (see the subclass)."""
        self._check_rejoin()
        self._membership = join_group(None)
        self.rank, self.world = self._membership.rank, self._membership.world
        self._connect(0)
        return self._read_again()

    def _check_rejoin(self) -> None:
        """Raise unless the survivors can go on with this handle."""
        raise RuntimeError(f"a {self.handle_name} cannot go on after a rank died")

    def _read_again(self) -> list:
        """In the new group: read again what this rank now holds; what it read."""
        raise NotImplementedError

    # -- the log-density sum -------------------------------------------------------------------

    def pysp_seq_log_density_sum(self, estimate: Any) -> tuple[float, float]:
        """The count and the summed log-density of the data under ``estimate``, over every rank.

        Parameters
        ----------
        estimate : Distribution
            The model, the same on every rank (checked in the same exchange); named as in
            mixle's handle.

        Returns
        -------
        tuple of (float, float)
            ``(count, total log-density)``, identical on every rank.

        Raises
        ------
        Exception
            On every rank together when any rank's scoring failed: the failed rank its own
            error, the others :class:`~mixle_nb.parallel.fail_together.PeerRankError`; a
            ``ValueError`` on a rank whose model differs from the others'."""
        summed_over_ranks = self._scores_are_summed()
        if summed_over_ranks:
            require_every_rank(self._membership, f"a log-density sum on a {self.handle_name}")
        error, text, count, total = None, None, 0.0, 0.0
        try:
            text = self._model_text(estimate)
            count, total = self._local_log_density(estimate)
        except Exception as exc:  # carried in the sum, so no peer waits for this rank
            error = self.explain_failure(exc, estimate)
        if not summed_over_ranks:
            if error is not None:
                raise error
            return count, total
        check = StatusCheck("log-density sum", text, "the model on this rank", SAME_MODEL)
        summed = self.exchange.checked_sum(LOG_DENSITY_HEADER, check, error, count=count, total=total)
        return summed.count, summed.total

    def _scores_are_summed(self) -> bool:
        """Whether every rank scores its own part and the sums cross ranks (else one rank's
        score is the whole)."""
        return True

    def _local_log_density(self, model: Any) -> tuple[float, float]:
        """``(count, total)`` of this rank's data under ``model``."""
        raise NotImplementedError

    def _model_text(self, model: Any) -> str | None:
        """A text equal on two ranks exactly when ``model`` is the same (``None``: not checked)."""
        return None

    def explain_failure(self, error: BaseException, model: Any) -> BaseException:
        """The error to report for ``error``, raised while scoring under ``model``.

        Parameters
        ----------
        error : BaseException
            What scoring (or a step) under ``model`` raised.
        model : object
            The model it ran under.

        Returns
        -------
        BaseException
            ``error`` itself; a handle that can name a mismatch between model and data
            returns a clearer error instead.
        """
        return error

    # -- close ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Release what this rank holds; destroy the process group only if this handle made it."""
        self._drop_resident()
        self._membership.release()

    def _drop_resident(self) -> None:
        """Drop the data and state this rank keeps for the handle."""
