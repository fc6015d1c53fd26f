package natsconn

import (
	"strings"
	"testing"
)

func TestRedactURL(t *testing.T) {
	for name, tc := range map[string]struct{ in, want, secret string }{
		"user and password":          {"nats://bridge:s3cr3t@127.0.0.1:4222", "nats://bridge:REDACTED@127.0.0.1:4222", "s3cr3t"},
		"token as user info":         {"nats://tok3n@host:4222", "nats://REDACTED@host:4222", "tok3n"},
		"no user info":               {"nats://127.0.0.1:4222", "nats://127.0.0.1:4222", ""},
		"no scheme":                  {"bridge:pw@host:4222", "bridge:REDACTED@host:4222", "pw"},
		"tls scheme":                 {"tls://u:p4ss@h:4443", "tls://u:REDACTED@h:4443", "p4ss"},
		"password with slash and at": {"nats://u:a/b@c@host:4222", "nats://REDACTED@host:4222", "a/b"},
		"percent-encoded password":   {"nats://u:p%40ss@host", "nats://u:REDACTED@host", "p%40ss"},
		"list, one with a password": {
			"nats://a:4222,nats://u:pw1@b:4222,nats://tk@c:4222",
			"nats://a:4222,nats://u:REDACTED@b:4222,nats://REDACTED@c:4222", "pw1",
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := RedactURL(tc.in)
			if got != tc.want {
				t.Fatalf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if tc.secret != "" && strings.Contains(got, tc.secret) {
				t.Fatalf("RedactURL(%q) = %q still holds the secret", tc.in, got)
			}
		})
	}
}
