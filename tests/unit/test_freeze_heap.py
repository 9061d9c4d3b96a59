"""A started node freezes the heap it started with out of the collector's generations
(node.app.freeze_heap): a full collection then walks only what was made since."""

import gc

from floering.node.app import freeze_heap


def test_the_heap_alive_after_start_up_is_left_out_of_every_collection():
    gc.unfreeze()
    try:
        kept = [[i] for i in range(10_000)]         # containers alive at start-up
        frozen = freeze_heap()
        assert frozen >= 10_000 and gc.get_freeze_count() == frozen
        assert not any(o is kept[0] for o in gc.get_objects())
        assert len(gc.get_objects()) < 1_000 < frozen
        later = [[i] for i in range(100)]           # made after: collected as before
        assert any(o is later[0] for o in gc.get_objects())
        gc.collect()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
