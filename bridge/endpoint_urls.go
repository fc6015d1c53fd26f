package bridge

import "strings"

// EndpointURLs lists c's endpoints, comma-separated, for a ready log line (`fpmbus bridge`, `fpmbus up`).
func (c Config) EndpointURLs() string {
	urls := make([]string, len(c.Endpoints))
	for i, ep := range c.Endpoints {
		urls[i] = ep.URL
	}
	return strings.Join(urls, ",")
}
