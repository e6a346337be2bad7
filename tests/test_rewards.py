from softtokens.rewards import REWARD_BOXED_WRONG, REWARD_CORRECT, REWARD_NO_BOX, reward


def test_correct_boxed_answer():
    assert reward(" \\boxed{72}.", "72") == REWARD_CORRECT == 100.0


def test_equivalent_forms_are_correct():
    assert reward(" \\boxed{\\frac{1}{2}}.", "0.5") == 100.0
    assert reward(" \\boxed{0.5}", "\\frac{1}{2}") == 100.0


def test_boxed_but_wrong():
    assert reward(" \\boxed{71}.", "72") == REWARD_BOXED_WRONG == 10.0


def test_no_box_scores_zero_even_if_the_number_is_right():
    assert reward(" 72.", "72") == REWARD_NO_BOX == 0.0
    assert reward(" \\boxed{72", "72") == 0.0  # unclosed box is not an answer


def test_custom_reward_values():
    assert reward(" \\boxed{3}", "4", correct=1.0, boxed_wrong=-1.0, no_box=-2.0) == -1.0
