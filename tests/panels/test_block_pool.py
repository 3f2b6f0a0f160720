"""The panel models of chapters 5 and 6 (BlockPoolPanel, ForkPanel): pure, each action's effect on the
real block manager, refusals as notes, the scripted demo, and the browser configuration's tokens."""

import json

import pytest

from paged_kv.errors import BlockError, ConfigError, OutOfBlocksError, PromptError
from paged_kv.model import ByteTokenizer
from paged_kv.panels.base import figure_json, step
from paged_kv.panels.block_pool import MAX_FORKS, BlockPoolPanel, ForkPanel
from paged_kv.panels.continuations import load_recordings

PANELS = [BlockPoolPanel, ForkPanel]


def run(model, actions, state=None):
    """Every action through step(), as a front does: (final state, the steps)."""
    state = model.initial() if state is None else state
    steps = []
    for a in actions:
        steps.append(step(model, state, a))
        state = steps[-1].state
    return state, steps


def seen(model, state) -> tuple:
    """What a front shows of ``state``, and the manager's own record of it."""
    live = state.live
    return (figure_json(model.figure(state)), model.status(state), live.manager.num_free_blocks,
            {s: list(t) for s, t in live.tokens.items()}, len(live.history.snapshots))


@pytest.mark.parametrize("cls", PANELS)
def test_apply_never_changes_the_state_it_is_given(cls):
    model = cls()
    state = model.initial()
    for action in cls.demo_actions + [{"op": "step"}, {"op": "finish", "request": 0}]:
        before = seen(model, state)
        done = step(model, state, action)
        assert seen(model, state) == before, action            # the old state is as it was
        if not done.note:
            assert done.state is not state and seen(model, done.state) != before, action
        state = done.state


def test_a_state_can_be_continued_twice_the_same_way():
    """Purity gives branching: two actions from one state, neither sees the other."""
    model = BlockPoolPanel(num_blocks=8, block_size=4)
    base, _ = run(model, [{"op": "add", "prompt": "To be, or not to be"}])
    a = model.apply(base, {"op": "add_length", "length": 8})
    b = model.apply(base, {"op": "finish", "request": 0})
    assert a.live.running == [0, 1] and b.live.running == [] and base.live.running == [0]
    assert (a.live.manager.num_free_blocks, b.live.manager.num_free_blocks, base.live.manager.num_free_blocks) == (1, 8, 3)


def test_add_decode_finish_and_preempt_drive_the_manager():
    model = BlockPoolPanel(num_blocks=6, block_size=4)
    s, _ = run(model, [{"op": "add", "prompt": "To be, or not to be"}])       # 19 tokens: 5 blocks
    assert s.live.manager.block_table(0).block_ids == [0, 1, 2, 3, 4]
    s = model.apply(s, {"op": "step"})
    assert s.live.manager.num_tokens(0) == 20
    s = model.apply(s, {"op": "add_length", "length": 3})                    # the last free block
    assert s.live.manager.num_free_blocks == 0 and s.live.tokens[1] == [ord(" ")] * 3
    s = model.apply(s, {"op": "preempt", "request": 1})
    assert s.live.running == [0] and list(s.live.waiting) == [1] and s.live.manager.num_free_blocks == 1
    assert s.live.history.events[-1].kind == "preempt" and "preempted" in s.message
    s = model.apply(s, {"op": "step"})           # 0 takes the freed block; 1 could not stay: no room
    assert "request 1 readmitted" in s.message and "request 1 preempted (latest arrival)" in s.message
    s = model.apply(s, {"op": "finish", "request": 0})
    assert s.live.running == [] and s.live.manager.num_free_blocks == 6       # finish returns its blocks
    s = model.apply(s, {"op": "step"})                                       # recomputed: it fits now
    assert s.message.startswith("request 1 readmitted") and s.live.running == [1]
    assert s.live.manager.num_tokens(1) == 4 and s.live.manager.num_free_blocks == 5
    s.live.manager.check()


def test_fork_raises_ref_counts_and_the_first_write_copies_the_shared_last_block():
    model = ForkPanel(num_blocks=16, block_size=4)
    s, _ = run(model, [{"op": "add", "prompt": "To be, or not"}])             # 13 tokens: blocks 0-3, 3 holds 1
    s = model.apply(s, {"op": "fork", "request": 0, "n": 2})
    alloc = s.live.manager.allocator
    assert s.live.running == [0, 1, 2] and [alloc.ref_count(b) for b in range(4)] == [3, 3, 3, 3]
    assert s.live.manager.num_free_blocks == 12 and "requests 1, 2 forked from request 0" in s.message
    s = model.apply(s, {"op": "step"})                                       # all three write into block 3
    copies = [c for e in s.live.history.events[-3:] for c in e.copies]
    assert len(copies) == 2 and {src for src, _ in copies} == {3}            # two copies, the last writer in place
    assert alloc is not s.live.manager.allocator                             # (the state was copied)
    alloc = s.live.manager.allocator
    assert [alloc.ref_count(b) for b in range(4)] == [3, 3, 3, 1] and s.live.manager.num_free_blocks == 10
    s = model.apply(s, {"op": "finish", "request": 1})                       # prune: only its own block back
    alloc = s.live.manager.allocator
    assert [alloc.ref_count(b) for b in range(3)] == [2, 2, 2] and s.live.manager.num_free_blocks == 11
    s.live.manager.check()


def test_append_to_one_sample_copies_the_shared_last_block_for_it_alone_and_finish_frees_its_own():
    """The panel's "append to selected" (vLLM paper §4.4): after a fork every block has 3 holders;
    one token for sample 1 copies the partly filled last block (block 3, 1 token) for sample 1
    only, so block 3 has one holder fewer and the others keep theirs; pruning sample 1 then
    returns exactly its copy."""
    model = ForkPanel(num_blocks=16, block_size=4)
    s, _ = run(model, [{"op": "add", "prompt": "To be, or not"}, {"op": "fork", "request": 0, "n": 2}])
    m = s.live.manager
    assert [m.allocator.ref_count(b) for b in range(4)] == [3, 3, 3, 3] and m.num_free_blocks == 12
    s = model.apply(s, {"op": "append", "request": 1})
    m = s.live.manager
    (copy,) = s.live.history.events[-1].copies
    assert copy[0] == 3 and m.block_table(1).block_ids == [0, 1, 2, copy[1]] and copy[1] >= 4
    assert [m.allocator.ref_count(b) for b in range(4)] == [3, 3, 3, 2] and m.allocator.ref_count(copy[1]) == 1
    assert [m.num_tokens(q) for q in (0, 1, 2)] == [13, 14, 13] and m.num_free_blocks == 11
    assert m.block_table(0).block_ids == m.block_table(2).block_ids == [0, 1, 2, 3]
    assert s.message == f"copy-on-write: request 1 wrote into shared block 3: copied to block {copy[1]}"
    s = model.apply(s, {"op": "finish", "request": 1})
    m = s.live.manager
    assert s.live.history.events[-1].freed_blocks == (copy[1],) and m.num_free_blocks == 12
    assert [m.allocator.ref_count(b) for b in range(4)] == [2, 2, 2, 2]
    m.check()


def test_append_is_refused_without_sharing_and_for_a_waiting_request():
    pool = BlockPoolPanel(num_blocks=8, block_size=4)
    assert "unknown action 'append'" in step(pool, pool.initial(), {"op": "append", "request": 0}).note
    model = ForkPanel(num_blocks=8, block_size=4)
    s, steps = run(model, [{"op": "add", "prompt": "abcd"}, {"op": "preempt", "request": 0},
                           {"op": "append", "request": 0}])
    assert "request 0 is waiting to be recomputed" in steps[2].note and list(s.live.waiting) == [0]


@pytest.mark.parametrize("action, error, words", [
    ({"op": "add_length", "length": 100}, OutOfBlocksError, "out of KV blocks"),
    ({"op": "add", "prompt": ""}, PromptError, "no tokens"),
    ({"op": "add", "prompt": 12}, PromptError, "must be text"),
    ({"op": "add_length", "length": 2.5}, PromptError, "prompt length"),
    ({"op": "finish", "request": 7}, BlockError, "request 7"),
    ({"op": "finish"}, BlockError, "no request to finish"),
    ({"op": "preempt", "request": 7}, BlockError, "request 7 is not running"),
    ({"op": "append", "request": 7}, BlockError, "request 7 is not running"),
    ({"op": "append"}, BlockError, "no request to append to"),
    ({"op": "fork", "request": 0, "n": MAX_FORKS + 1}, ConfigError, f"at most {MAX_FORKS}"),
    ({"op": "fork", "request": 0, "n": 0}, ConfigError, "must be an int >= 1, got 0"),
    ({"op": "view", "view": "3d"}, ConfigError, "unknown view '3d'"),
    ({"op": "teleport"}, ConfigError, "unknown action 'teleport'"),
])
def test_a_refusal_is_a_note_and_changes_nothing(action, error, words):
    model = ForkPanel(num_blocks=8, block_size=4)
    s, _ = run(model, [{"op": "add", "prompt": "To be, or not to be"}])
    with pytest.raises(error, match=words):
        model.apply(s, action)
    before = seen(model, s)
    done = step(model, s, action)
    assert words in done.note and done.state is s and seen(model, done.state) == before


def test_fork_is_refused_without_sharing_and_for_a_waiting_request():
    pool = BlockPoolPanel(num_blocks=8, block_size=4)
    assert "unknown action 'fork'" in step(pool, pool.initial(), {"op": "fork", "request": 0}).note
    model = ForkPanel(num_blocks=8, block_size=4)
    s, steps = run(model, [{"op": "add", "prompt": "abcd"}, {"op": "add", "prompt": "ef"},
                           {"op": "preempt", "request": 1}, {"op": "fork", "request": 1},
                           {"op": "preempt", "request": 1}])
    assert "waiting to be recomputed; fork a running request" in steps[3].note
    assert "already preempted" in steps[4].note and list(s.live.waiting) == [1]


@pytest.mark.parametrize("cls", PANELS)
def test_demo_actions_are_json_and_run_without_error(cls):
    assert 4 <= len(cls.demo_actions) <= 8
    actions = json.loads(json.dumps(cls.demo_actions))
    state, steps = run(cls(), actions)
    ops = {a["op"] for a in actions}
    assert {"add", "step", "finish"} <= ops and ("fork" in ops) == ("append" in ops) == (cls is ForkPanel)
    assert any(s.note for s in steps)                                   # it shows a refusal too
    assert sum(1 for s in steps if not s.note) >= len(steps) - 1
    assert all(isinstance(s.status, str) and figure_json(s.figure) for s in steps)
    state.live.manager.check()
    json.dumps(cls().controls())                                        # the page draws these


@pytest.mark.parametrize("cls", PANELS)
def test_the_controls_make_the_actions_apply_takes(cls):
    """A button's action is its op plus every named input's value: each one is taken (or refused
    with a note of ours), none is an internal error."""
    model = cls(num_blocks=12, block_size=4)
    controls = model.controls()
    inputs = {c["name"]: c["value"] for c in controls if c["kind"] != "button"}
    state, _ = run(model, [{"op": "add", "prompt": "To be"}])
    for button in (c for c in controls if c["kind"] == "button"):
        assert button["op"] in model.ops()
        step(model, state, {"op": button["op"], **inputs})


def test_the_view_switches_between_the_pool_and_the_logical_view():
    model = BlockPoolPanel(num_blocks=6, block_size=4)
    s, _ = run(model, [{"op": "add", "prompt": "To be"}])
    pool = model.figure(s)
    logical = model.figure(model.apply(s, {"op": "view", "view": "logical"}))
    assert [t.name for t in pool.data][:2] == ["pool", "block labels"]
    assert [t.name for t in logical.data] == ["words", "labels"] and not logical.frames
    assert figure_json(model.figure(model.apply(s, {"op": "step", "view": "logical"}))) != figure_json(logical)
    with pytest.raises(ConfigError, match="unknown view"):
        BlockPoolPanel(view="3d")


def test_the_constructor_takes_json_args():
    args = json.loads(json.dumps({"num_blocks": 10, "block_size": 2, "sharing": True, "view": "logical",
                                  "prompt": "what news?", "length": 4}))
    model = BlockPoolPanel(**args)
    assert model.sharing and "fork" in model.ops() and model.title == "10 blocks × 2 slots"
    assert model.initial().live.manager.num_blocks == 10 and model.initial().view == "logical"
    for bad in ({"num_blocks": 0}, {"block_size": 1.5}, {"length": 0}, {"prompt": 3}, {"sharing": "no"}):
        with pytest.raises(ConfigError):
            BlockPoolPanel(**bad)
    with pytest.raises(ConfigError, match="sampling needs a model"):
        ForkPanel(sampling=object())


def test_the_browser_configuration_replays_the_recorded_continuation():
    """No model: an offered prompt decodes the tiny model's recorded greedy continuation, and the
    status says so; a typed prompt gets a stand-in, its own bytes, labelled as one."""
    recorded = load_recordings()
    model = BlockPoolPanel()
    assert model.initial().live.model is None
    prompt = "To be, or not to be"
    s, _ = run(model, [{"op": "add", "prompt": prompt}, {"op": "add", "prompt": "xyz"}] + [{"op": "step"}] * 5)
    tok = ByteTokenizer()
    n = len(tok.encode(prompt))
    want = tok.encode(prompt + recorded[prompt])
    assert s.live.tokens[0] == want[:n + 5] and s.live.pending[0] == want[n + 5]
    assert s.live.text(0) == prompt + recorded[prompt][:6]
    typed = s.live.tokens[1] + [s.live.pending[1]]
    assert typed[:3] == list(b"xyz") and set(typed[3:]) <= set(b"xyz")
    status = model.status(s)
    assert f"request 0 (recorded): {prompt + recorded[prompt][:6]!r}" in status
    assert "request 1 (stand-in)" in status and "no model runs in the browser" not in status   # said once
    first = model.initial()
    assert model.status(first).count("no model runs in the browser") == 1           # the first status
    added, _ = run(model, [{"op": "add", "prompt": "xyz"}])
    assert "no model runs in the browser" in model.status(added)                     # the first stand-in
    again, _ = run(model, [{"op": "step"}], added)
    assert "no model runs in the browser" not in model.status(again)


def test_forks_in_the_browser_replay_the_same_continuation():
    recorded = load_recordings()
    model = ForkPanel()
    s, _ = run(model, [{"op": "add", "prompt": "To be, or not"}, {"op": "fork", "request": 0, "n": 2},
                       {"op": "step"}, {"op": "step"}])
    assert {s.live.text(k) for k in (0, 1, 2)} == {"To be, or not" + recorded["To be, or not"][:3]}
    assert [src for _, _, src in model.request_lines(s)] == ["recorded"] * 3


def test_the_jupyter_configuration_decodes_with_the_model_and_stays_pure(small_model):
    """With a model the cache is part of the state: two decode steps from one state give the same
    tokens, so the first did not write into the state it was given; they are generate()'s."""
    from paged_kv.decoding import generate

    tok = ByteTokenizer()
    model = ForkPanel(num_blocks=12, block_size=4, model=small_model, tokenizer=tok)
    s, _ = run(model, [{"op": "add", "prompt": "It was"}, {"op": "fork", "request": 0}])
    a, b = model.apply(s, {"op": "step"}), model.apply(s, {"op": "step"})
    assert a.live.tokens == b.live.tokens and a.live.pending == b.live.pending
    assert a.live.model is small_model and a.live.cache is not s.live.cache
    want = generate(small_model, [tok.encode("It was")], 2, cache="contiguous").tokens[0]
    assert a.live.tokens[0][6:] + [a.live.pending[0]] == want
    assert model.request_lines(a)[0][2] == ""                        # the model's own: no label
    assert "no model runs" not in model.status(a)


def test_a_live_requests_factory_is_driven_as_given():
    from paged_kv.engine import LiveRequests

    made = []

    def factory(num_blocks, block_size):
        made.append((num_blocks, block_size))
        return LiveRequests(None, None, num_blocks, block_size)

    model = BlockPoolPanel(num_blocks=5, block_size=2, live_requests_factory=factory)
    s, _ = run(model, [{"op": "add", "prompt": "abc"}, {"op": "step"}])
    assert made == [(5, 2)] and s.live.manager.num_tokens(0) == 4
    assert model.request_lines(s) == [] and "recorded" not in model.status(s)


def test_a_prompt_given_by_length_reads_as_its_count_of_spaces():
    model = BlockPoolPanel()
    s, _ = run(model, [{"op": "add_length", "length": 12}, {"op": "add", "prompt": "a b"}])
    status = model.status(s)
    # the 12 prompt spaces and the stand-in's first token after the prefill, a space again
    assert "request 0 (stand-in): 13 spaces (a prompt given by its length)" in status
    assert "request 1 (stand-in): 'a b" in status          # quoted as typed, then its stand-in
