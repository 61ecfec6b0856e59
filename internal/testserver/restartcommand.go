package testserver

import (
	"strconv"
	"strings"
)

// restartScriptTimeout bounds each wait in the RestartCommand script, in seconds.
const restartScriptTimeout = 30

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// pingFunc is a bash function answering whether 127.0.0.1:$port replies
// +PONG to an inline PING (a merely accepted connection is not enough: the
// server answers -LOADING while it replays the append-only file).
const pingFunc = `ping_ok() {
	exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
	printf 'PING\r\n' >&3 || return 1
	IFS= read -r -t 2 line <&3 || return 1
	exec 3<&- 3>&-
	case "$line" in "+PONG"*) return 0 ;; esac
	return 1
}
`

// processRestartScript kills the server whose pid is in pidFile and waits
// until the supervisor has started a new process (a different pid in
// pidFile) that answers PING.
func processRestartScript(pidFile string, port int) string {
	return "pidfile=" + shellQuote(pidFile) + "\n" +
		"port=" + strconv.Itoa(port) + "\n" +
		"limit=" + strconv.Itoa(restartScriptTimeout) + "\n" +
		pingFunc + `
old=$(cat "$pidfile" 2>/dev/null)
if [ -z "$old" ]; then
	echo "testserver: no server pid in $pidfile (server not running?)" >&2
	exit 1
fi
kill -KILL "$old" 2>/dev/null
end=$((SECONDS + limit))
while kill -0 "$old" 2>/dev/null; do
	if [ "$SECONDS" -ge "$end" ]; then
		echo "testserver: server pid $old still running after kill" >&2
		exit 1
	fi
	sleep 0.02
done
end=$((SECONDS + limit))
while :; do
	new=$(cat "$pidfile" 2>/dev/null)
	if [ -n "$new" ] && [ "$new" != "$old" ] && (ping_ok) 2>/dev/null; then
		exit 0
	fi
	if [ "$SECONDS" -ge "$end" ]; then
		echo "testserver: server on port $port not back after restart" >&2
		exit 1
	fi
	sleep 0.05
done
`
}

// dockerRestartScript runs docker restart and waits until the server
// answers PING again.
func dockerRestartScript(containerID string, port int) string {
	return "id=" + shellQuote(containerID) + "\n" +
		"port=" + strconv.Itoa(port) + "\n" +
		"limit=" + strconv.Itoa(restartScriptTimeout) + "\n" +
		pingFunc + `
docker restart "$id" >/dev/null || exit 1
end=$((SECONDS + limit))
until (ping_ok) 2>/dev/null; do
	if [ "$SECONDS" -ge "$end" ]; then
		echo "testserver: container $id not back after restart" >&2
		exit 1
	fi
	sleep 0.05
done
`
}
