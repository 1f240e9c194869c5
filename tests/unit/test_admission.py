"""admission.NewQueue: the order new trajectories are offered in, and its strictness."""

import pytest

from rstar2cli.scheduler.admission import NewQueue
from rstar2cli.scheduler.predict import SiblingLengths


def _queue(order: str, groups: dict[str, list[str]]) -> tuple[NewQueue, SiblingLengths]:
    lengths = SiblingLengths()
    queue = NewQueue(order, lengths)
    for group, keys in groups.items():
        for key in keys:
            lengths.add(key, group)
            queue.add(key, group)
    return queue, lengths


def _offered(queue: NewQueue, refuse: str | None = None) -> list[str]:
    """Offer everything; start all but `refuse`, telling the lengths table, as the scheduler does."""
    seen: list[str] = []

    def start(key) -> bool:
        seen.append(key)
        if key != refuse:
            queue.lengths.update(key, 0)
        return key != refuse

    queue.admit(start)
    return seen


def test_data_order_offers_in_insertion_order_and_stops_at_the_first_refusal():
    queue, _ = _queue("data", {"p": ["a1", "a2"], "q": ["b1"]})
    # b1 is never offered: a2 refused, and no later trajectory jumps the queue
    assert _offered(queue, refuse="a2") == ["a1", "a2"]
    assert len(queue) == 2
    assert _offered(queue) == ["a2", "b1"]
    assert len(queue) == 0


def test_predicted_order_learns_every_prompt_first_then_starts_the_longest_group():
    queue, lengths = _queue("predicted", {"short": ["s1", "s2", "s3"], "long": ["l1", "l2", "l3"]})
    # nothing measured: one sample of each prompt first (first-seen order), then ties go to the
    # group with the fewest started; refusing s2 ends the round there
    assert _offered(queue, refuse="s2") == ["s1", "l1", "s2"]
    lengths.update("s1", 100, done=True)
    lengths.update("l1", 3000, done=True)
    # both groups measured: the longer one's samples go first, the shorter one's after
    assert _offered(queue) == ["l2", "l3", "s2", "s3"]


def test_discard_and_take_all_keep_the_count_and_data_order():
    queue, _ = _queue("predicted", {"p": ["a1", "a2"], "q": ["b1", "b2"]})
    queue.discard("a2", "p")
    queue.discard("zz", "p")  # not queued: nothing changes
    assert len(queue) == 3
    assert queue.take_all() == ["a1", "b1", "b2"]
    assert len(queue) == 0 and _offered(queue) == []


def test_an_unknown_order_is_refused():
    with pytest.raises(ValueError, match="unknown admission"):
        NewQueue("random", SiblingLengths())
