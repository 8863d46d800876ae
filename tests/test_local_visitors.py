"""Local mode (no API keys) is single-tenant: each browser is a visitor of its own, who sees only its own jobs, but
the visitors of one client address share one user's quota and at most VISITORS_PER_ADDRESS turns, so a script that
mints identities (a fresh cookie jar each) takes no more of the queue than one user."""

from __future__ import annotations

import re

import pytest

from tasks import keys
from tasks.store.jobs import VISITORS_PER_ADDRESS


@pytest.fixture
def settings(settings):  # type: ignore[no-untyped-def]
    return settings.model_copy(update={"max_queue": 100, "max_queued_per_user": 3})


class Visitor:
    """A browser at `address`: a fresh cookie jar, whose first GET / mints its identity and its CSRF token."""

    def __init__(self, app, address: str = "10.0.0.1") -> None:  # type: ignore[no-untyped-def]
        self.client, self.environ = app.test_client(), {"REMOTE_ADDR": address}
        html = self.client.get("/", environ_base=self.environ).get_data(as_text=True)
        self.token = re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)  # type: ignore[union-attr]

    def submit(self):  # type: ignore[no-untyped-def]
        return self.client.post(
            "/v1/jobs",
            json={"prompt": "x", "max_tokens": 3},
            headers={"X-CSRF-Token": self.token},
            environ_base=self.environ,
        )

    def jobs(self) -> list[str]:
        return [j["id"] for j in self.client.get("/v1/jobs", environ_base=self.environ).get_json()["data"]]


def test_identities_minted_in_a_loop_get_no_more_than_one_users_quota(app, store):
    # Given a script that mints a new identity for each submission, from one address
    admitted, refused = [], []
    for _ in range(20):
        response = Visitor(app).submit()
        (admitted if response.status_code == 202 else refused).append(response)

    # Then its visitors got one user's quota in all; the rest were refused with 429 and when to retry
    assert len(admitted) == 3 and store.redis.zcard(keys.WAITING) == 3
    assert {r.status_code for r in refused} == {429}
    assert all(r.get_json()["error"]["type"] == "quota_exceeded" for r in refused)
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    assert "your address" in refused[0].get_json()["error"]["message"]
    # And a visitor at another address still gets its own quota
    other = Visitor(app, "10.0.0.2")
    assert [other.submit().status_code for _ in range(4)] == [202, 202, 202, 429]


def test_at_most_a_few_visitors_of_one_address_have_jobs_waiting(app, store, settings, make_app):
    # Given a quota large enough that only the bound on visitors can refuse
    app = make_app(settings.model_copy(update={"max_queued_per_user": 32}))
    visitors = [Visitor(app) for _ in range(VISITORS_PER_ADDRESS + 1)]

    # When each submits a job
    answers = [v.submit() for v in visitors]

    # Then the first VISITORS_PER_ADDRESS are admitted (each a turn of its own) and the next is refused, with 429
    assert [a.status_code for a in answers] == [202] * VISITORS_PER_ADDRESS + [429]
    assert int(answers[-1].headers["Retry-After"]) >= 1
    assert "browsers at your address" in answers[-1].get_json()["error"]["message"]
    # And a visitor already in may submit more; once one visitor's jobs leave the queue, a new one gets in
    assert visitors[0].submit().status_code == 202
    first = answers[1].get_json()["id"]
    assert (
        visitors[1]
        .client.delete(
            f"/v1/jobs/{first}", headers={"X-CSRF-Token": visitors[1].token}, environ_base=visitors[1].environ
        )
        .status_code
        == 200
    )
    assert visitors[-1].submit().status_code == 202
    # And the record of who is in lives no longer than the jobs it counts
    assert 0 < store.redis.ttl(keys.address_visitors("10.0.0.1")) <= settings.job_ttl_s + settings.result_ttl_s


def test_two_browsers_on_one_machine_each_see_only_their_own_jobs(app):
    alice, bob = Visitor(app), Visitor(app)
    mine, theirs = alice.submit().get_json()["id"], bob.submit().get_json()["id"]

    assert alice.jobs() == [mine] and bob.jobs() == [theirs]
    assert bob.client.get(f"/v1/jobs/{mine}", environ_base=bob.environ).status_code == 404
