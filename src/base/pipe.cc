#include "base/pipe.h"

#include <unistd.h>

#include "base/error.h"

namespace berth {

Pipe make_pipe(std::string_view what, int flags) {
    int ends[2];
    check_sys("pipe2", what, [&] { return ::pipe2(ends, flags); });
    return Pipe{UniqueFd(ends[0]), UniqueFd(ends[1])};
}

}  // namespace berth
