"""A test "browser" for the Python SDK's simple-auth example (DESIGN §17).

Usage: python3 oauth_browser.py URL. Opens URL (the authorization request
`mcpctl auth login --no-browser` printed), follows the authorization
server to its login page, posts the example's demo login, and follows the
redirect to mcpctl's listener. Prints OK and exits 0 once the listener
answered 200.
"""

import sys
import urllib.parse
import urllib.request


def main(url):
    with urllib.request.urlopen(url, timeout=30) as page:
        # The authorize endpoint redirected to /login?state=…&client_id=…
        login = urllib.parse.urlparse(page.geturl())
    state = urllib.parse.parse_qs(login.query)["state"][0]
    form = urllib.parse.urlencode(
        {"username": "demo_user", "password": "demo_password", "state": state}
    ).encode()
    callback = f"{login.scheme}://{login.netloc}/login/callback"
    # The callback redirects to mcpctl's listener, which answers 200.
    with urllib.request.urlopen(callback, data=form, timeout=30) as answer:
        assert answer.status == 200, answer.status
        assert answer.geturl().startswith("http://127.0.0.1:"), answer.geturl()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1])
