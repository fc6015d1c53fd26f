package natsconn

import (
	"net/url"
	"strings"
)

// Redacted replaces a secret wherever fpmbus shows a value that held one.
const Redacted = "REDACTED"

// RedactURL returns a server URL, or a comma-separated list of them, safe to log or put in an error: the
// password of user:password@ is replaced by Redacted (the user name stays: it says which identity was
// refused), and a user info without a password — a token, nats://TOKEN@host — is replaced as a whole.
// Every URL fpmbus was given goes through it before it reaches a log line, an error or -h output.
// Whatever precedes the last '@' of an element (after its scheme) is user info: a password holding '/',
// '#' or '@' is redacted too, even though it does not parse.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = redactOne(p)
	}
	return strings.Join(parts, ",")
}

func redactOne(raw string) string {
	at := strings.LastIndex(raw, "@")
	if at < 0 {
		return raw
	}
	scheme, rest := "", raw
	if i := strings.Index(raw, "://"); i >= 0 && i < at {
		scheme, rest = raw[:i+3], raw[i+3:]
	}
	info := Redacted
	if u, err := url.Parse("nats://" + strings.TrimSpace(rest)); err == nil && u.User != nil {
		if _, hasPass := u.User.Password(); hasPass && u.User.Username() != "" {
			info = u.User.Username() + ":" + Redacted
		}
	}
	return scheme + info + raw[at:]
}
