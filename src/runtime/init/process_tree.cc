#include "runtime/init/process_tree.h"

#include <dirent.h>

#include <string>

#include "base/files.h"

namespace berth::init {

std::vector<pid_t> children_of(pid_t pid) {
    std::vector<pid_t> out;
    const std::string task_dir = "/proc/" + std::to_string(pid) + "/task";
    DIR* dir = ::opendir(task_dir.c_str());
    if (!dir) return out;  // exited meanwhile
    while (dirent* e = ::readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        std::string list;
        try {
            list = read_file(task_dir + "/" + e->d_name + "/children");
        } catch (const std::exception&) {
            continue;
        }
        size_t pos = 0;
        while (pos < list.size()) {
            size_t end = list.find(' ', pos);
            if (end == std::string::npos) end = list.size();
            if (end > pos)
                out.push_back(static_cast<pid_t>(std::stol(list.substr(pos, end - pos))));
            pos = end + 1;
        }
    }
    ::closedir(dir);
    return out;
}

std::vector<pid_t> tree_of(const std::vector<pid_t>& roots) {
    std::vector<pid_t> tree = roots;
    for (size_t i = 0; i < tree.size(); ++i) {
        for (pid_t child : children_of(tree[i])) tree.push_back(child);
    }
    return tree;
}

}  // namespace berth::init
