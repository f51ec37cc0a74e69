"""One router per API: ``v1`` (our own), ``stream`` (server-sent events), ``libretranslate``,
``files`` (LibreTranslate's file translation), ``ops`` (health, readiness, metrics) and
``page`` (the web page at ``/``)."""
