"""The web layer: views, the JSON API, forms, middleware, URLs, /metrics and the admin site. It parses,
calls one function of a room, and renders."""
