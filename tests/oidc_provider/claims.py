"""The provider's claims and its refusal of deactivated users.

Claims: ``preferred_username``, ``email``, ``groups`` (the user's groups at the provider) and
``tenants`` (the groups named ``tenant:<name>``, as ``<name>``), in the ID token and from
userinfo. A user deactivated here (``is_active`` false) is refused what a real identity
provider refuses them: their access and refresh tokens stop working (userinfo answers 401, a
refresh is an invalid grant), and they cannot sign in."""

from __future__ import annotations

from oauth2_provider.oauth2_validators import OAuth2Validator


class ClaimsValidator(OAuth2Validator):
    oidc_claim_scope = None  # every claim below, whatever scopes were asked

    def get_additional_claims(self, request):
        user = request.user
        names = sorted(user.groups.values_list("name", flat=True))
        return {
            "preferred_username": user.username,
            "email": user.email,
            "groups": [n for n in names if not n.startswith("tenant:")],
            "tenants": [n.removeprefix("tenant:") for n in names if n.startswith("tenant:")],
        }

    def validate_bearer_token(self, token, scopes, request):
        valid = super().validate_bearer_token(token, scopes, request)
        return valid and request.user is not None and request.user.is_active

    def validate_refresh_token(self, refresh_token, client, request, *args, **kwargs):
        valid = super().validate_refresh_token(refresh_token, client, request, *args, **kwargs)
        return valid and request.user.is_active
