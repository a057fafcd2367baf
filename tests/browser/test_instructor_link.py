"""Instructor mode reached the way the README says (issue #19, point 1): the link that
`python3 quickstart.py lab --instructor` prints (/instructor#token=…) logs the browser in
and leaves no token in the address bar; the presets table lists lessons by number; the
class view has a Log out button too."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import LabServer, serve_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(120)]

TOKEN = "a-browser-test-instructor-token"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    yield from serve_lab(tmp_path_factory, "instructor-link", TOKEN)


def number_key(number: str) -> tuple[int, ...]:
    return tuple(int(p) for p in number.split("."))


def test_the_printed_login_link_logs_in_and_the_class_view_logs_out(lab: Any, page: Any) -> None:
    page.goto(f"{lab.url}/instructor#token={TOKEN}")
    page.wait_for_function("() => document.body.dataset.auth === 'in'")
    assert "token" not in page.url
    page.locator("#preset-rows tr").first.wait_for()
    numbers = [
        t.split(" · ")[0] for t in page.locator("#preset-rows tr td:first-child").all_inner_texts()
    ]
    assert numbers == sorted(numbers, key=number_key), numbers

    page.goto(f"{lab.url}/class")
    page.wait_for_function("() => document.body.dataset.auth === 'in'")
    page.locator("#logout").click()
    page.wait_for_url(f"{lab.url}/instructor")
    page.wait_for_function("() => document.body.dataset.auth === 'out'")
    assert page.locator("#login-form").is_visible()
    assert page.errors == []


def test_a_wrong_token_in_the_link_says_so_and_logs_nobody_in(lab: Any, page: Any) -> None:
    page.goto(f"{lab.url}/instructor#token=not-the-token-at-all")
    page.locator("#login-error").filter(has_text="token").wait_for()
    assert page.evaluate("() => document.body.dataset.auth") == "out"
    assert "token=" not in page.url
