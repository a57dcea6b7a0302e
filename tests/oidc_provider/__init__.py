"""A real OpenID Connect provider for the single sign-on tests: a tiny Django project of its own
(django-oauth-toolkit with its OIDC support, RS256, its own SQLite file), run in its own
process by ``serve``; ``people`` holds what the tests and the provider both need to know."""
