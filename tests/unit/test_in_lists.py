"""broker.store.in_lists: look-ups by many keys are cut into bounded IN lists."""

from broker.store.in_lists import IN_LIST_MAX, in_chunks


def test_keys_are_cut_in_order_into_slices_of_at_most_the_bound() -> None:
    keys = [(f"job{i}", i) for i in range(2 * IN_LIST_MAX + 1)]
    chunks = list(in_chunks(keys))
    assert [len(c) for c in chunks] == [IN_LIST_MAX, IN_LIST_MAX, 1]
    assert [k for c in chunks for k in c] == keys
    assert list(in_chunks([])) == []
