"""The wrapper's control directory as two ranks read it: a checkpoint request that one rank read at a step
boundary and the other had not yet (it came between their reads) is answered once, by the checkpoint
both agreed on, not a second time at the slower rank's next boundary (found by CI under load:
test_torchrun's SIGUSR1 case committed two checkpoints)."""

from __future__ import annotations

from spotguard_agent.ranks import ControlDir


def test_a_request_answered_by_the_agreed_checkpoint_is_not_new_to_a_slower_rank(tmp_path):
    wrapper, fast, slow = ControlDir(tmp_path), ControlDir(tmp_path), ControlDir(tmp_path)
    assert not slow.new_checkpoint_request()  # the slow rank reads before the request comes
    wrapper.request_checkpoint("SIGUSR1")
    assert fast.new_checkpoint_request()  # the fast rank reads after: the ranks agree to checkpoint
    for rank in (fast, slow):
        rank.consume_checkpoint_requests()
    assert not slow.new_checkpoint_request() and not fast.new_checkpoint_request()
    wrapper.request_checkpoint("SIGUSR1 again")  # a later request is new to both
    assert fast.new_checkpoint_request() and slow.new_checkpoint_request()
