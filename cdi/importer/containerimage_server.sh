# cdi-containerimage-server: serves the one disk image of a containerDisk image over HTTP, from inside
# that image (registry `pullMethod: node`, CDI's tools/cdi-containerimage-server).
#
#   server -p PORT -image-dir DIR -ready-file FILE -done-file FILE
#
# The importer pod's init container copies this script and Debian's static busybox (busybox-static)
# into the shared emptyDir and puts that busybox on the first line (`cdi.importer.containerimage.install`);
# the user's image runs the script as its `server` container, so nothing here may need anything of
# that image: every tool is an applet of the busybox beside this script. The HTTP serving is busybox
# httpd's, not ours: a server any pod of the cluster can reach must not be hand-written parsing of
# untrusted requests (issue 26: the C server this replaces overflowed its stack on a 12 KiB header).
# httpd forks one process per connection and drops a client that has not sent its head in 60
# seconds, so a silent or slow client cannot hold up the importer; it bounds every line and the
# number of header bytes it keeps; it serves GET and HEAD with single byte ranges.
#
# This script checks that DIR holds exactly one regular file, serves a document root of its own in
# the shared directory holding that file (a link) and `info` (the environment, as JSON: CDI's
# ServerInfo, from which the importer derives the volume's labels), listens on $POD_IP (localhost
# without it), writes the file's name to the ready file once httpd answers, and exits 0 once the done
# file appears (the importer creates it when it has finished, whatever the outcome).
set -u
case $0 in */*) base=${0%/*} ;; *) base=. ;; esac
base=$(cd "$base" && pwd)
bb=$base/busybox

fail() {
    echo "$*" >&2
    exit 1
}

port=8100 dir=. ready=/shared/ready done=/shared/done
# -h: print the usage and exit 0, serving nothing. A DataImportCron's poller runs the image with it (as
# CDI's does): the node pulls the image and reports its digest, and the container ends at once.
case ${1:-} in -h | -help | --help)
    echo "usage: server -p PORT -image-dir DIR -ready-file FILE -done-file FILE"
    exit 0 ;;
esac
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || fail "cdi-containerimage-server: $1 needs a value"
    flag=${1#-}
    case ${flag#-} in
        p) port=$2 ;;
        image-dir) dir=$2 ;;
        ready-file) ready=$2 ;;
        done-file) done=$2 ;;
        *) echo "cdi-containerimage-server: unknown flag $1" >&2; exit 2 ;;
    esac
    shift 2
done

if [ -e /sysroot ] || [ -e /ostree ]; then
    fail "bootc image detected: this image contains an ostree-based bootable OS and cannot be imported as a regular container disk"
fi

# exactly one entry, a regular file (not a link: what it points to is not the image's to serve)
count=0 name=
for entry in "$dir"/* "$dir"/.[!.]* "$dir"/..?*; do
    [ -e "$entry" ] || [ -L "$entry" ] || continue
    count=$((count + 1))
    name=${entry##*/}
done
if [ "$count" -ne 1 ] || [ -L "$dir/$name" ] || [ ! -f "$dir/$name" ]; then
    fail "Failed get image filename in $dir: Invalid container image"
fi
# the importer asks for /info and for /NAME: a file of that name could not be told apart
[ "$name" != info ] || fail "Failed get image filename in $dir: the image's file may not be named info"
image=$(cd "$dir" && pwd)/$name

# the document root holds nothing but the image's link and info; the configuration is empty, so that
# an /etc/httpd.conf of the user's image (authentication, CGI, ...) changes nothing
root=$base/www
conf=$base/httpd.conf
"$bb" rm -rf "$root" && "$bb" mkdir "$root" && : >"$conf" || fail "cdi-containerimage-server: cannot write to $base"
"$bb" ln -s "$image" "$root/$name" || fail "cdi-containerimage-server: cannot link $image"
"$bb" awk 'BEGIN {
    printf "{\"Env\":["
    n = 0
    for (key in ENVIRON) {
        entry = key "=" ENVIRON[key]
        out = ""
        for (i = 1; i <= length(entry); i++) {
            c = substr(entry, i, 1)
            if (c == "\"" || c == "\\") out = out "\\" c
            else if (c == "\n") out = out "\\n"
            else if (c == "\t") out = out "\\t"
            else if (c == "\r") out = out "\\r"
            else if (c < " ") out = out " "
            else out = out c
        }
        printf "%s\"%s\"", (n++ ? "," : ""), out
    }
    print "]}"
}' >"$root/info" || fail "cdi-containerimage-server: cannot write $root/info"

ip=${POD_IP:-127.0.0.1}
case $ip in
    *:*) listen="[$ip]:$port" url="http://[$ip]:$port/info" ;;
    *) listen="$ip:$port" url="http://$ip:$port/info" ;;
esac
"$bb" httpd -f -c "$conf" -h "$root" -p "$listen" &
httpd=$!
trap '"$bb" kill "$httpd" 2>/dev/null; exit 143' TERM INT

# ready once httpd answers (its bind may also fail: then its message is in the log, and the pod fails)
# (wget under timeout: busybox 1.35's wget -T crashes)
tries=0
until "$bb" timeout 2 "$bb" wget -q -Y off -O /dev/null "$url" 2>/dev/null; do
    "$bb" kill -0 "$httpd" 2>/dev/null || { wait "$httpd"; fail "cdi-containerimage-server: httpd could not serve on $listen"; }
    tries=$((tries + 1))
    [ "$tries" -lt 300 ] || fail "cdi-containerimage-server: httpd does not answer on $listen"
    "$bb" sleep 0.1
done
printf '%s' "$name" >"$ready" || fail "cdi-containerimage-server: cannot write $ready"
echo "Serving $dir on HTTP port: $port" >&2

while [ ! -e "$done" ]; do
    "$bb" kill -0 "$httpd" 2>/dev/null || fail "cdi-containerimage-server: httpd stopped"
    "$bb" sleep 0.5
done
"$bb" kill "$httpd" 2>/dev/null
wait "$httpd" 2>/dev/null  # (ash may report the killed job as "Terminated": not news)
"$bb" rm -rf "$done" "$ready" "$root" "$conf"
echo "Importer has completed" >&2
exit 0
