"""The web layer: routes per API (``v1``, ``libretranslate``, ``ops``), errors, middleware,
lifecycle and the dependencies routes share. The app factory is ``service.app.create_app``."""
