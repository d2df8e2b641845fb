"""The router's tokenizer earns trust on whole prompts and loses it for good on one mismatch."""

from __future__ import annotations

from pdx_router.policy.trust import PROBATION_TURNS, TokenizerTrust


def test_trust_starts_on_probation_for_the_configured_number_of_prompts() -> None:
    t = TokenizerTrust()
    assert t.state == "probation" and not t.trusted and t.needed == PROBATION_TURNS


def test_trust_needs_every_probation_prompt_to_match() -> None:
    t = TokenizerTrust(needed=2).after_match()
    assert t.state == "probation" and not t.trusted
    t = t.after_match()
    assert t.state == "trusted" and t.trusted


def test_one_mismatch_on_probation_or_once_trusted_disables_it_for_good() -> None:
    for t in (TokenizerTrust(needed=2), TokenizerTrust(needed=2).after_match().after_match()):
        off = t.after_mismatch()
        assert off.state == "disabled" and not off.trusted
        assert off.after_match().after_match().after_match().state == "disabled"
        assert off.after_mismatch().state == "disabled"


def test_transitions_return_a_new_state_and_leave_the_old_one_alone() -> None:
    t = TokenizerTrust(needed=1)
    assert t.after_match().trusted and t.after_mismatch().off
    assert t == TokenizerTrust(needed=1)
