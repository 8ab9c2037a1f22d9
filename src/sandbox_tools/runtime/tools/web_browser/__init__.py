"""web_browser: a headless Chromium driven over the DevTools protocol on a private pipe."""
