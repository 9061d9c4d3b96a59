"""Key -> token routing for mappers: the pure ring plus a bounded cache.

A dict lookup is ~5x cheaper than hashing and bisecting, and word streams repeat
keys heavily. Tokens, not nodes, are cached: a token's owner changes on failover
but its position does not, so the cache survives most ring changes. A split adds a
token, and then the cache starts afresh."""

from __future__ import annotations

from floering.wire.ring import Ring


class Router:
    def __init__(self, ring: Ring, max_cached: int = 1 << 20) -> None:
        self.max_cached = max_cached
        # The ring and its cache as one value: the mapper's thread routes while the
        # event loop's thread may swap in a new ring, and a token computed with the
        # old ring must never land in the new ring's cache.
        self._routes: tuple[Ring, dict] = (ring, {})

    @property
    def ring(self) -> Ring:
        return self._routes[0]

    @property
    def cache(self) -> dict:
        return self._routes[1]

    def token(self, key) -> int:
        ring, cache = self._routes
        token = cache.get(key)
        if token is None:
            token = ring.token_for_key(key)  # raises InvalidKey for a bad key
            if len(cache) >= self.max_cached:
                cache.clear()
            cache[key] = token
        return token

    def fixed(self):
        """(ring, route): a router bound to the current ring, for a run of keys that
        must all be routed with one ring. `route.cached` looks a key up in that ring's
        cache only (None when not there): a map() over it runs at C speed."""
        ring, cache = self._routes
        max_cached = self.max_cached

        def route(key) -> int:
            token = cache.get(key)
            if token is None:
                token = ring.token_for_key(key)
                if len(cache) >= max_cached:
                    cache.clear()
                cache[key] = token
            return token

        def fill(keys: list, tokens: list) -> None:
            """Cache the tokens of `keys`, computed in bulk with this ring."""
            if len(keys) <= max_cached:
                if len(cache) + len(keys) > max_cached:
                    cache.clear()
                cache.update(zip(keys, tokens))
        route.cached = cache.get
        route.fill = fill
        return ring, route

    def update(self, ring: Ring) -> None:
        old, cache = self._routes
        self._routes = (ring, cache if ring.tokens == old.tokens else {})
